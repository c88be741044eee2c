"""--ditgate-target fails a session on the wrong device; the header, JUnit XML and environment.json carry provenance."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from pytest_ditgate.device import real_device

SUITE = "import pytest\n@pytest.mark.requires_gpu\ndef test_gpu():\n    pass\ndef test_plain():\n    pass\n"


def not_this_machine(*targets: str) -> str:
    """The first of ``targets`` that this machine's real device is not (the A5500 runner is an a5500, the GPU
    check's machine an sm_90)."""
    from pytest_ditgate.target import evaluate_target

    return next(t for t in targets if evaluate_target(t, real_device()) is not None)


@pytest.mark.parametrize("profile, targets", [("h200", ("a5500", "h200")), ("a5500", ("sm_90", "sm_80")),
                                              ("cpu", ("a5500", "h200")), ("rtx4090", ("a5500", "h200"))])
def test_target_mismatch_fails_the_session(pytester: pytest.Pytester, use_profile, profile: str,
                                           targets: tuple[str, ...]) -> None:
    """A target is checked against the machine's real device, whatever profile decides the skips: a target
    the machine is not fails the session."""
    target = not_this_machine(*targets)
    use_profile(profile)
    pytester.makepyfile(SUITE)
    result = pytester.runpytest("--ditgate", f"--ditgate-target={target}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*ditgate target mismatch*--ditgate-target={target}*not a reason to skip*"])
    assert "passed" not in result.stdout.str()  # nothing ran


def test_real_cpu_machine_fails_a_gpu_target(pytester: pytest.Pytester) -> None:
    if real_device().is_cuda:
        pytest.skip("this machine has a GPU; the no-GPU case is covered by the cpu profile tests")
    pytester.makepyfile(SUITE)
    result = pytester.runpytest("--ditgate", "--ditgate-target=a5500")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*device is cpu (*"])


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch):
    """Make this process detect the device of a shipped profile as its real device (a stand-in for that GPU)."""
    import dataclasses

    from pytest_ditgate import device, profiles

    def be(name: str) -> None:
        info = dataclasses.replace(profiles.load_profile(name), source="detected")
        monkeypatch.setattr(device, "detect_device", lambda *args, **kwargs: info)
        device.clear_cache()

    return be


@pytest.mark.parametrize("real, target", [("a5500", "a5500"), ("a5500", "sm_86"), ("h200", "h200"), ("cpu", "cpu")])
def test_target_match_runs(pytester: pytest.Pytester, machine, real: str, target: str) -> None:
    machine(real)
    pytester.makepyfile("def test_plain():\n    pass\n")
    pytester.runpytest("--ditgate", f"--ditgate-target={target}").assert_outcomes(passed=1)


@pytest.mark.parametrize("command", ["pytest", "doctor"])
def test_a_profile_cannot_stand_in_for_the_target_device(pytester: pytest.Pytester, machine, use_profile, capsys,
                                                         command: str) -> None:
    """Issue 51: a profile changes what is skipped, not the hardware: on a CPU machine DITGATE_DEVICE_PROFILE=a5500
    used to satisfy --ditgate-target=a5500, so a runner that lost its GPU went green."""
    from pytest_ditgate import cli

    machine("cpu")
    use_profile("a5500")
    if command == "doctor":
        assert cli.main(["doctor", "--target", "a5500"]) == 1
        assert "this machine's device is cpu" in capsys.readouterr().out
        return
    pytester.makepyfile("def test_plain():\n    pass\n")
    result = pytester.runpytest("--ditgate", "--ditgate-target=a5500")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--ditgate-target=a5500, but this machine's device is cpu*the device profile 'a5500' "
                                 "in force changes what is skipped, not the hardware*"])


def test_unknown_target_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_plain():\n    pass\n")
    result = pytester.runpytest("--ditgate", "--ditgate-target=b9000")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown device profile 'b9000'*"])


def test_header_line_names_device_and_profile(pytester: pytest.Pytester, use_profile) -> None:
    use_profile("a5500")
    pytester.makepyfile("def test_plain():\n    pass\n")
    result = pytester.runpytest("--ditgate")
    result.stdout.fnmatch_lines(["ditgate: NVIDIA RTX A5500 sm_86, 24 GiB, driver ?, torch *, CUDA ?*PROFILE a5500 in force*"])


def test_header_absent_when_gates_off(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_plain():\n    pass\n")
    result = pytester.runpytest()
    assert "ditgate:" not in result.stdout.str()


def test_junit_properties_and_environment_json(pytester: pytest.Pytester, use_profile) -> None:
    use_profile("h200")
    pytester.makepyfile("def test_plain():\n    pass\n")
    result = pytester.runpytest("--ditgate", "--junitxml=out.xml", "-o", "junit_family=xunit2")
    result.assert_outcomes(passed=1)
    root = ET.parse(pytester.path / "out.xml").getroot()
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["ditgate_arch"] == "sm_90"
    assert props["ditgate_device"] == "NVIDIA H200"
    assert props["ditgate_device_source"].startswith("profile:h200")
    env = json.loads((pytester.path / ".ditgate" / "environment.json").read_text())
    assert env["device"]["arch"] == "sm_90" and env["profile"] == "h200"
    assert env["real_device"]["arch"] == real_device().arch  # the machine itself, beside the profile in force
    assert env["packages"]["pytest"]


def test_artefact_dir_option(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_plain():\n    pass\n")
    pytester.runpytest("--ditgate", "--ditgate-dir=artefacts/here").assert_outcomes(passed=1)
    assert (pytester.path / "artefacts" / "here" / "environment.json").is_file()
    assert not (pytester.path / ".ditgate").exists()


def test_ditgate_commit_names_the_measured_commit_over_git(pytester: pytest.Pytester, monkeypatch) -> None:
    """A tree copied to a GPU host may carry a stale .git: the commit stated in $DITGATE_COMMIT wins."""
    pytester.makepyfile("def test_ok():\n    pass\n")
    monkeypatch.setenv("DITGATE_COMMIT", "0123abc")
    pytester.runpytest("--ditgate").assert_outcomes(passed=1)
    env = json.loads((pytester.path / ".ditgate" / "environment.json").read_text())
    assert env["commit"] == "0123abc"
