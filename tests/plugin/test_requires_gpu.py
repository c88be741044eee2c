"""The requires_gpu marker: every requirement kind against every shipped profile, exact reasons."""

from __future__ import annotations

import json

import pytest

from pytest_ditgate.profiles import load_profile, shipped_profiles

# requirement keywords -> the profiles on which the test must RUN (all others skip)
CASES = {
    "": {"a5500", "a100", "rtx4090", "h100", "h200"},
    'cc=">=8.0"': {"a5500", "a100", "rtx4090", "h100", "h200"},
    'cc="==8.6"': {"a5500"},
    'cc="8.0-8.9"': {"a5500", "a100", "rtx4090"},
    'cc=">=8.0,<9.0"': {"a5500", "a100", "rtx4090"},
    'cc=["8.6", "9.0"]': {"a5500", "h100", "h200"},
    'cc="sm_90"': {"h100", "h200"},
    "min_memory_gb=40": {"a100", "h100", "h200"},
    "bf16=True": {"a5500", "a100", "rtx4090", "h100", "h200"},
    "fp8=True": {"rtx4090", "h100", "h200"},
    "tf32=True": {"a5500", "a100", "rtx4090", "h100", "h200"},
    'sdpa="flash"': {"a5500", "a100", "rtx4090", "h100", "h200"},
    'sdpa=["flash", "cudnn"]': {"h100", "h200"},
    "gpus=2": set(),
    "nvcc=True": None,  # depends on the host toolchain: checked separately
}


def test_every_shipped_profile_loads() -> None:
    names = shipped_profiles()
    assert {"cpu", "a5500", "a100", "rtx4090", "h100", "h200"} <= set(names)
    a5500 = load_profile("a5500")
    assert (a5500.arch, a5500.sm_count, a5500.l2_bytes, a5500.bf16, a5500.fp8, a5500.sdpa["flash"]) == (
        "sm_86", 80, 6 * 2**20, True, False, True)
    assert a5500.is_profile and a5500.profile_name == "a5500"


@pytest.mark.parametrize("profile", ["cpu", "a5500", "a100", "rtx4090", "h100", "h200"])
def test_requirement_kinds_under_profile(pytester: pytest.Pytester, use_profile, profile: str) -> None:
    use_profile(profile)
    cases = {k: v for k, v in CASES.items() if v is not None}
    body = ["import pytest"]
    for number, kwargs in enumerate(cases):
        body += [f"@pytest.mark.requires_gpu({kwargs})", f"def test_case_{number}():", "    pass", ""]
    pytester.makepyfile("\n".join(body))
    result = pytester.runpytest("--ditgate", "-rs")
    reports = {r.nodeid.split("::")[-1]: r for r in result.reprec.getreports("pytest_runtest_logreport") if r.when == "call" or r.skipped}
    for number, (kwargs, runs_on) in enumerate(cases.items()):
        report = reports[f"test_case_{number}"]
        expected_run = profile in runs_on
        assert report.passed is expected_run, f"requires_gpu({kwargs}) on {profile}: {report.longrepr}"
        if not expected_run:
            reason = report.longrepr[2]
            assert "needs " in reason and "device is " in reason


def test_exact_reason_for_fp8_on_a5500(pytester: pytest.Pytester, use_profile) -> None:
    use_profile("a5500")
    pytester.makepyfile("""
        import pytest
        @pytest.mark.requires_gpu(cc=">=8.9", why="fp8")
        def test_fp8():
            pass
        @pytest.mark.requires_gpu(fp8=True, min_memory_gb=48)
        def test_two():
            pass
    """)
    result = pytester.runpytest("--ditgate", "-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines([
        "SKIPPED * needs sm>=8.9 for fp8; device is sm_86 (NVIDIA RTX A5500)",
        "SKIPPED * needs 48 GB of device memory (has 24.0 GB), fp8 (sm>=8.9); device is sm_86 (NVIDIA RTX A5500)",
    ])


def test_no_gpu_reason(pytester: pytest.Pytester, use_profile) -> None:
    use_profile("cpu")
    pytester.makepyfile("import pytest\n@pytest.mark.requires_gpu\ndef test_x():\n    pass\n")
    result = pytester.runpytest("--ditgate", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*needs a CUDA GPU; device is cpu (profile cpu: no CUDA device)*"])


def test_compatible_device_never_skips(pytester: pytest.Pytester, use_profile) -> None:
    use_profile("h200")
    pytester.makepyfile("""
        import pytest
        @pytest.mark.requires_gpu(cc=">=9.0", fp8=True, bf16=True, tf32=True, sdpa=["flash", "efficient", "cudnn", "math"], min_memory_gb=100)
        def test_all():
            pass
    """)
    pytester.runpytest("--ditgate").assert_outcomes(passed=1)


@pytest.mark.parametrize("kwargs, message", [
    ("ccc='>=8.0'", "unknown requirement(s) ccc"),
    ("'8.0'", "keyword requirements only"),
    ("cc='>>8'", "cannot parse"),
    ("sdpa='turbo'", "unknown backend 'turbo'"),
    ("gpus=0", "integer >= 1"),
    ("fp8='yes'", "True or False"),
    ("packages=[]", "non-empty list"),
    ("packages=3", "distribution name"),
    ("packages='quack kernels'", "cannot parse 'quack kernels'"),
    ("packages='quack-kernels>>0.6'", "cannot parse"),
    ("packages='quack-kernels>=0.7,<0.6'", "can never hold"),
])
def test_bad_markers_are_usage_errors(pytester: pytest.Pytester, kwargs: str, message: str) -> None:
    pytester.makepyfile(f"import pytest\n@pytest.mark.requires_gpu({kwargs})\ndef test_x():\n    pass\n")
    result = pytester.runpytest("--ditgate")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*test_x*{message}*"])


def test_bad_marker_rejected_even_with_gates_off(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("import pytest\n@pytest.mark.requires_gpu(vram=8)\ndef test_x():\n    pass\n")
    assert pytester.runpytest().ret == pytest.ExitCode.USAGE_ERROR


def test_user_profile_from_path(pytester: pytest.Pytester, use_profile) -> None:
    path = pytester.path / "myboard.json"
    path.write_text(json.dumps({"name": "Lab L40S", "arch": "sm_89", "fp8": True, "bf16": True, "total_memory_bytes": 48 * 2**30}))
    use_profile(str(path))
    pytester.makepyfile("""
        import pytest
        @pytest.mark.requires_gpu(fp8=True)
        def test_fp8():
            pass
        @pytest.mark.requires_gpu(cc=">=9.0")
        def test_hopper():
            pass
    """)
    result = pytester.runpytest("--ditgate", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*needs sm>=9.0; device is sm_89 (Lab L40S)*"])


@pytest.mark.parametrize("profile,tool,found,met,unmet", [
    ("a5500", "nvcc", "12.4", ">=12.0", ">=13"),
    # a nightly triton is read by its release numbers: the marker is judged, not a usage error of a correct test
    ("h200", "triton", "3.4.0.dev20250601+git1a2b", ">=3.0", ">=3.5"),
])
def test_toolchain_requirement_follows_the_host(pytester: pytest.Pytester, use_profile, monkeypatch, profile: str,
                                                tool: str, found: str, met: str, unmet: str) -> None:
    from pytest_ditgate import toolchain

    use_profile(profile)
    monkeypatch.setattr(toolchain, f"{tool}_version", lambda: found)
    pytester.makepyfile(f"""
        import pytest
        @pytest.mark.requires_gpu({tool}="{met}")
        def test_new():
            pass
        @pytest.mark.requires_gpu({tool}="{unmet}")
        def test_newer():
            pass
    """)
    result = pytester.runpytest("--ditgate", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines([f"*needs {tool} {unmet} (found {found})*"])


def test_package_requirement_reads_what_is_installed(pytester: pytest.Pytester, use_profile) -> None:
    """An optional package a GPU test needs (``packages=``) skips with the package named, installed or not;
    an installed one at a matching version runs. The names are distributions (pip's), not import names."""
    import importlib.metadata

    found = importlib.metadata.version("pytest")
    use_profile("h200")
    pytester.makepyfile("""
        import pytest
        @pytest.mark.requires_gpu(cc=">=9.0", packages="pytest>=1.0")
        def test_installed():
            pass
        @pytest.mark.requires_gpu(packages=["pytest", "ditgate-no-such-distribution"], why="a missing kernel library")
        def test_missing():
            pass
        @pytest.mark.requires_gpu(packages="pytest>=999")
        def test_too_old():
            pass
    """)
    result = pytester.runpytest("--ditgate", "-rs")
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines_random([
        "SKIPPED * needs ditgate-no-such-distribution (not installed) for a missing kernel library; device is sm_90 *",
        f"SKIPPED * needs pytest>=999 (found {found}); device is sm_90 *",
    ])


def test_package_requirement_on_a_cpu_names_the_package(pytester: pytest.Pytester, use_profile) -> None:
    use_profile("cpu")
    pytester.makepyfile("""
        import pytest
        @pytest.mark.requires_gpu(cc=">=9.0", packages="quack-kernels>=0.6.5")
        def test_x():
            pass
    """)
    result = pytester.runpytest("--ditgate", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*needs a CUDA GPU with sm>=9.0, quack-kernels>=0.6.5; device is cpu*"])
