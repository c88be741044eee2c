"""A check run beside a ``--ditgate-refreeze`` run reads a consistent store: a golden file replaced after the
reader read the manifest is judged against the manifest as it is now (re-read under its lock), not reported as
tampered with; a file that disagrees with the current manifest is still tampering."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

TESTS = """
import os, pathlib, time
import pytest, torch

V = float(os.environ["VAL"])
SYNC = os.environ.get("SYNC")

def test_anchor(golden):
    golden.check("anchor", {"x": torch.ones(4096)})
    if SYNC:  # the reader: its manifest is read; a refreeze replaces the goldens before it checks them
        pathlib.Path(SYNC, "read").touch()
        deadline = time.monotonic() + 120
        while not pathlib.Path(SYNC, "written").exists():
            assert time.monotonic() < deadline, "the refreeze never finished"
            time.sleep(0.02)

@pytest.mark.parametrize("i", range(4))
def test_g(golden, i):
    golden.check(f"g{i}", {"out": torch.full((64, 64), V + i)})
"""


def _pytest(project: Path, *args: str, val: float, sync: Path | None = None) -> subprocess.Popen:
    """pytest in a process of its own, in ``project``."""
    env = {**os.environ, "VAL": str(val)}
    env.pop("SYNC", None)
    if sync is not None:
        env["SYNC"] = str(sync)
    return subprocess.Popen([sys.executable, "-m", "pytest", *ARGS, *args], cwd=project, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finished(process: subprocess.Popen) -> tuple[int, str]:
    out, _ = process.communicate(timeout=240)
    return process.returncode, out


def run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *args: str, val: float) -> pytest.RunResult:
    """pytest in this process (torch is imported already: fast)."""
    monkeypatch.setenv("VAL", str(val))
    monkeypatch.delenv("SYNC", raising=False)
    return pytester.runpytest(*ARGS, *args)


ARGS = ("--ditgate", "-q", "-p", "no:cacheprovider", "-rfE")


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project whose five goldens are frozen (VAL=1)."""
    pytester.makefile(".toml", pyproject="[tool.pytest.ini_options]\n")
    pytester.makepyfile(test_g=TESTS)
    run(pytester, monkeypatch, "--ditgate-freeze", val=1.0).assert_outcomes(passed=5)
    return pytester.path


def _wait_for(path: Path, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while not path.exists():
        assert process.poll() is None, process.communicate()[0]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def test_a_check_beside_a_refreeze_judges_the_goldens_it_finds(project: Path, pytester: pytest.Pytester,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader (a process of its own) reads the manifest, then a refreeze replaces every golden, then the
    reader checks them with the refrozen values. It used to fail each with a false "[golden_integrity] golden
    file ... was modified: sha256 ..., manifest says ...; restore it from version control"."""
    sync = project / "sync"
    sync.mkdir()
    reader = _pytest(project, val=7.0, sync=sync)
    try:
        _wait_for(sync / "read", reader)
        run(pytester, monkeypatch, "--ditgate-refreeze", val=7.0).assert_outcomes(passed=5)
    finally:
        (sync / "written").touch()
    code, out = _finished(reader)
    assert "golden_integrity" not in out and "was modified" not in out, out
    assert code == 0 and "5 passed" in out, out


def test_a_tampered_golden_file_is_still_caught(project: Path, pytester: pytest.Pytester,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The re-read under the lock finds the same manifest: a file that disagrees with it is tampering."""
    store = project / "golden"
    entries = json.loads((store / "manifest.json").read_text())["entries"]
    (store / "cpu" / "g0.safetensors").write_bytes((store / "cpu" / "g1.safetensors").read_bytes())
    assert json.loads((store / "manifest.json").read_text())["entries"] == entries
    result = run(pytester, monkeypatch, val=1.0)
    result.assert_outcomes(passed=4, failed=1)
    out = result.stdout.str()
    assert f"[golden_integrity] golden file {store / 'cpu' / 'g0.safetensors'} was modified: sha256 " in out, out
    assert "manifest says" in out and "restore it from version control" in out, out


@pytest.mark.slow  # two pytest processes at a time, twice: ~30 s on two shared cores
def test_a_check_racing_a_refreeze_never_reports_tampering(project: Path) -> None:
    """No synchronisation: a refreeze and a check, each a process of its own, start together, twice. Each check
    passes or fails as a mismatch (it judged a golden before or after it changed), never as golden_integrity."""
    for attempt in range(2):
        value = 7.0 + attempt
        writer = _pytest(project, "--ditgate-refreeze", val=value)
        reader = _pytest(project, val=value)
        (written, writer_out), (_, reader_out) = _finished(writer), _finished(reader)
        assert written == 0, writer_out
        assert "golden_integrity" not in reader_out, (attempt, reader_out)
