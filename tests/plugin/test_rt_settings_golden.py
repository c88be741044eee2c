"""Red-team round on the golden store and the fixed-paths lock: a JSON record that names one key twice (a hand
edit, a merge of two branches' manifests) used to be read with the last entry winning silently, so a tampered
entry beside an honest one decided what was compared. Now the manifest, the freeze journal and the lock refuse
it, naming the key; an honest store and lock still read."""

from __future__ import annotations

import json

import pytest

TEST = """
import torch

def test_g(golden):
    golden.check("a", {"out": torch.arange(12, dtype=torch.float32).reshape(3, 4)}, device="cpu")
"""


def _twice(text: str, key: str, first: object, second: object) -> str:
    """A JSON object text naming ``key`` twice, with ``first`` then ``second``."""
    return "{%s: %s, %s: %s}" % (json.dumps(key), json.dumps(first), json.dumps(key), json.dumps(second))


def test_a_manifest_naming_a_golden_twice_is_refused(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_g=TEST)
    pytester.makepyprojecttoml("[tool.pytest.ini_options]\n")
    pytester.runpytest("--ditgate", "--ditgate-freeze", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    manifest = pytester.path / "golden" / "manifest.json"
    honest = json.loads(manifest.read_text())
    assert pytester.runpytest("--ditgate", "-p", "no:cacheprovider").ret == 0  # the honest store reads
    (ident, entry), = honest["entries"].items()
    forged = dict(entry, sha256="0" * 64)
    manifest.write_text('{"version": 1, "entries": %s}' % _twice("", ident, forged, entry))
    for args in ([], ["--ditgate-freeze"]):
        result = pytester.runpytest("--ditgate", "-p", "no:cacheprovider", *args)
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines([f"*[[]golden_integrity[]] {manifest}: golden manifest is malformed: the key "
                                     f"'{ident}' appears twice in one object (a hand edit or a merge?): keep one"])
        assert "INTERNALERROR" not in result.stdout.str()
    assert "0" * 64 in manifest.read_text()  # nothing rewrote the manifest: the user decides which entry counts


def test_a_lock_naming_a_file_twice_stops_the_session(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_g="def test_ok(): pass")
    pytester.mkdir("reference").joinpath("work.py").write_text("X = 1\n")
    pytester.makepyprojecttoml('[tool.ditgate]\nfixed_paths = ["reference/"]\n')
    assert pytester.runpytest("--ditgate", "--ditgate-relock", "-p", "no:cacheprovider").ret == 0
    assert pytester.runpytest("--ditgate", "-p", "no:cacheprovider").ret == 0  # the honest lock reads
    lock = pytester.path / "golden" / "fixed_paths.lock.json"
    data = json.loads(lock.read_text())
    path, digest = next((p, h) for p, h in data["files"].items() if p.startswith("reference/"))
    others = {p: h for p, h in data["files"].items() if p != path}
    files = _twice("", path, "0" * 64, digest)[:-1] + "".join(f", {json.dumps(p)}: {json.dumps(h)}"
                                                             for p, h in others.items()) + "}"
    rest = {k: v for k, v in data.items() if k != "files"}
    lock.write_text('{"files": %s, %s}' % (files, json.dumps(rest)[1:-1]))
    result = pytester.runpytest("--ditgate", "-p", "no:cacheprovider")
    assert result.ret != 0
    text = result.stdout.str() + result.stderr.str()
    assert f"is unreadable (the key '{path}' appears twice in one object (a hand edit or a merge?): keep one)" in text
    assert "INTERNALERROR" not in text


CASES = """
import pytest
import torch

@pytest.mark.parametrize("name", [NAMES])
def test_g(golden, name):
    golden.check(name, {"out": torch.full((4,), float(len(name)))}, device="cpu")
"""


def test_golden_names_that_differ_only_in_case_are_not_frozen_side_by_side(pytester: pytest.Pytester) -> None:
    """``cpu/a.safetensors`` and ``cpu/A.safetensors`` are one file on macOS or Windows: each freeze overwrote
    the other's golden, and a check there compared with whichever was written last."""
    pytester.makepyprojecttoml("[tool.pytest.ini_options]\n")
    pytester.makepyfile(test_g=CASES.replace("NAMES", '"gate.out", "Gate.Out"'))
    result = pytester.runpytest("--ditgate", "--ditgate-freeze", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*[[]golden_integrity[]] golden 'Gate.Out' for cpu was not frozen: the golden "
                                 "'cpu/gate.out' differs from it only in case*give the two goldens names that differ*"])
    assert [p.name for p in (pytester.path / "golden" / "cpu").iterdir()] == ["gate.out.safetensors"]
    # a later run freezing the twin alone meets the manifest's entry
    pytester.makepyfile(test_g=CASES.replace("NAMES", '"GATE.OUT"'))
    again = pytester.runpytest("--ditgate", "--ditgate-freeze", "-p", "no:cacheprovider")
    again.assert_outcomes(failed=1)
    again.stdout.fnmatch_lines(["*golden 'GATE.OUT' for cpu was not frozen: the golden 'cpu/gate.out' differs*"])


def test_names_that_differ_otherwise_are_frozen_and_checked(pytester: pytest.Pytester) -> None:
    pytester.makepyprojecttoml("[tool.pytest.ini_options]\n")
    pytester.makepyfile(test_g=CASES.replace("NAMES", '"gate.out", "gate.out2", "gate-out"'))
    pytester.runpytest("--ditgate", "--ditgate-freeze", "-p", "no:cacheprovider").assert_outcomes(passed=3)
    pytester.runpytest("--ditgate", "-p", "no:cacheprovider").assert_outcomes(passed=3)


RACE = """
import subprocess
import sys

import torch

def test_another_worker_freezes_first():
    # another xdist worker (here: another pytest process) freezes the name after this run read the manifest
    done = subprocess.run([sys.executable, "-m", "pytest", "--ditgate", "--ditgate-freeze", "-q", "-p",
                           "no:cacheprovider", "other.py"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout

def test_this_worker_freezes_it_too(golden):
    golden.check("shared", {"out": torch.full((4,), VALUE)}, device="cpu")
"""
OTHER = """
import torch

def test_other(golden):
    golden.check("shared", {"out": torch.full((4,), 1.0)}, device="cpu")
"""


def test_a_golden_another_worker_froze_since_the_run_began_is_not_untracked(pytester: pytest.Pytester) -> None:
    """Two xdist workers freezing one name with one value: the second found the first's file on disk, missing from
    the manifest it read at the start, and failed ``golden_untracked`` (1 run in 2 of ``-n 2`` here)."""
    pytester.makepyprojecttoml("[tool.pytest.ini_options]\npython_files = ['test_*.py', 'other.py']\n")
    pytester.makepyfile(other=OTHER, test_race=RACE.replace("VALUE", "1.0"))
    (pytester.path / "golden").mkdir()
    result = pytester.runpytest("--ditgate", "--ditgate-freeze", "-p", "no:cacheprovider", "test_race.py")
    result.assert_outcomes(passed=2)
    assert "golden_untracked" not in result.stdout.str()


def test_a_different_value_another_worker_froze_first_is_still_an_error(pytester: pytest.Pytester) -> None:
    pytester.makepyprojecttoml("[tool.pytest.ini_options]\npython_files = ['test_*.py', 'other.py']\n")
    pytester.makepyfile(other=OTHER, test_race=RACE.replace("VALUE", "2.0"))
    (pytester.path / "golden").mkdir()
    result = pytester.runpytest("--ditgate", "--ditgate-freeze", "-p", "no:cacheprovider", "test_race.py")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*[[]golden_not_written[]] golden 'cpu/shared' was frozen by another run or worker "
                                 "while this one ran (other.py::test_other*"])
    assert "golden_untracked" not in result.stdout.str()
