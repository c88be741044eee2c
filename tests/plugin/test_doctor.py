"""``ditgate doctor``: text and JSON output, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pytest_ditgate import cli, doctor


def run_cli(*args: str, env_profile: str | None = None) -> subprocess.CompletedProcess:
    import os

    env = dict(os.environ)
    env.pop("DITGATE_DEVICE_PROFILE", None)
    if env_profile:
        env["DITGATE_DEVICE_PROFILE"] = env_profile
    return subprocess.run([sys.executable, "-m", "pytest_ditgate", *args], capture_output=True, text=True, env=env, timeout=300)


def test_doctor_json_reports_device_and_dependencies() -> None:
    proc = run_cli("doctor", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    assert data["ok"] is True
    assert data["dependencies"]["torch"]["importable"] is True
    assert set(data["device"]["sdpa"]) == {"flash", "efficient", "cudnn", "math"}
    assert any("artefacts" in key for key in data["workspaces"])


def test_doctor_text_under_a_profile_says_so(use_profile, capsys) -> None:
    use_profile("a5500")  # in this process: the command line's own process is the JSON test's
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "PROFILE a5500 in force" in out
    assert "bf16 yes, fp8 no, tf32 yes" in out
    assert "flash yes" in out
    assert "real device" in out


def test_doctor_target_mismatch_exits_non_zero(use_profile, capsys) -> None:
    use_profile("h200")
    assert cli.main(["doctor", "--target", "a5500"]) == 1
    out = capsys.readouterr().out
    assert "target mismatch" in out and "NOT READY" in out


def _hide_module(monkeypatch: pytest.MonkeyPatch, hidden: str) -> None:
    """Make the doctor's import of ``hidden`` fail as if it were not installed."""
    real_import = doctor.importlib.import_module

    def fake_import(name: str, *args, **kwargs):
        if name == hidden:
            raise ImportError(f"No module named {hidden!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(doctor.importlib, "import_module", fake_import)


def test_doctor_missing_required_dependency_exits_non_zero(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    _hide_module(monkeypatch, "safetensors")
    assert cli.main(["doctor", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is False
    assert any("safetensors is not importable" in p for p in data["problems"])


def test_doctor_missing_optional_dependency_only_warns(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "lpips", None)  # find_spec reports it as not installed
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert any(line.split()[:2] == ["lpips", "MISSING"] for line in out.splitlines()), out
    assert "lpips is not importable" in out.split("warnings:")[1]


def test_doctor_locates_optional_dependencies_without_importing_them() -> None:
    code = ("import sys, json; from pytest_ditgate import doctor; r = doctor.check_dependencies(); "
            "print(json.dumps([sorted(m for m in ('diffusers', 'open_clip', 'lpips', 'matplotlib') if m in sys.modules),"
            " r['diffusers']['checked'], r['torch']['checked']]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    imported, optional_check, required_check = json.loads(proc.stdout)
    assert imported == []
    assert optional_check.startswith("located") and required_check == "imported"


def test_doctor_deep_imports_optional_dependencies(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """A broken optional install (importable by name, failing on import) is only seen with --deep."""
    _hide_module(monkeypatch, "hypothesis")
    kept = ("torch", "safetensors", "filelock", "hypothesis")  # importing diffusers etc. would only cost time
    monkeypatch.setattr(doctor, "DEPENDENCIES", tuple(d for d in doctor.DEPENDENCIES if d[0] in kept))
    assert cli.main(["doctor", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["dependencies"]["hypothesis"]["importable"] is True
    assert cli.main(["doctor", "--json", "--deep"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["dependencies"]["hypothesis"]["importable"] is False
    assert "hypothesis is not importable" in " ".join(data["warnings"])
