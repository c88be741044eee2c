"""The fixed-paths lock: verified at session start under --ditgate, rewritten only by deliberate runs."""

from __future__ import annotations

import json

import pytest

# --ditgate runs probe the device (torch); import it here once, since in-process pytester runs drop
# modules they imported and torch cannot be imported a second time in one process
pytest.importorskip("torch")

PYPROJECT = """
[tool.ditgate]
fixed_paths = [{paths}]
"""
TEST = """
def test_ok():
    pass
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makefile(".toml", pyproject=PYPROJECT.format(paths='"fixtures/", "impl/*.py"'))
    (pytester.path / "fixtures").mkdir()
    (pytester.path / "fixtures" / "corpus.toml").write_text("seed = 1\n")
    (pytester.path / "impl").mkdir()
    (pytester.path / "impl" / "base.py").write_text("X = 1\n")
    (pytester.path / "impl" / "notes.txt").write_text("not fixed\n")
    pytester.makepyfile(test_it=TEST)
    return pytester


def relock(project: pytest.Pytester) -> pytest.RunResult:
    result = project.runpytest("--ditgate", "--ditgate-relock")
    result.assert_outcomes(passed=1)
    return result


def test_missing_lock_stops_the_session(project: pytest.Pytester) -> None:
    result = project.runpytest("--ditgate")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert not result.reprec.getreports("pytest_runtest_logreport")  # stopped before any test
    result.stdout.fnmatch_lines(["*cannot verify the fixed paths: no fixed-paths lock at *fixed_paths.lock.json; run pytest --ditgate --ditgate-relock*"])


def test_relock_writes_sorted_hashes_and_says_so(project: pytest.Pytester) -> None:
    result = relock(project)
    result.stdout.fnmatch_lines(["*RELOCKED: fixed-paths lock *fixed_paths.lock.json rewritten (3 files, --ditgate-relock)*"])
    lock = json.loads((project.path / "golden" / "fixed_paths.lock.json").read_text())
    # the defaults are always locked: [tool.ditgate] as a table, every conftest.py, the pytest ini files
    assert list(lock["files"]) == ["fixtures/corpus.toml", "impl/base.py", "pyproject.toml#tool.ditgate"]
    assert lock["patterns"][-2:] == ["fixtures/", "impl/*.py"] and "**/conftest.py" in lock["patterns"]
    project.runpytest("--ditgate").assert_outcomes(passed=1)


@pytest.mark.parametrize("change, line", [
    (lambda p: (p / "fixtures" / "corpus.toml").write_text("seed = 2\n"), "*edited:  fixtures/corpus.toml*"),
    (lambda p: (p / "fixtures" / "extra.toml").write_text(""), "*added:   fixtures/extra.toml*"),
    (lambda p: (p / "impl" / "base.py").unlink(), "*removed: impl/base.py*"),
    (lambda p: (p / "pyproject.toml").write_text(PYPROJECT.format(paths='"fixtures/"')),
     "*fixed_paths setting changed: lock has ?*'fixtures/', 'impl/*.py'?, pyproject has ?*'fixtures/'?*"),
    (lambda p: (p / "conftest.py").write_text("import os\n"), "*added:   conftest.py*"),
    (lambda p: (p / "fixtures" / "loader.pyc").write_bytes(b"bytecode"), "*added:   fixtures/loader.pyc*"),
])
def test_any_change_stops_the_session_listing_it(project: pytest.Pytester, change, line) -> None:
    relock(project)
    change(project.path)
    result = project.runpytest("--ditgate")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert not result.reprec.getreports("pytest_runtest_logreport")  # stopped before any test
    result.stdout.fnmatch_lines(["*ditgate: fixed paths changed (lock *", line,
                                 "*if the change is deliberate, run pytest --ditgate --ditgate-relock*"])


def test_unfixed_files_and_gates_off_are_not_checked(project: pytest.Pytester) -> None:
    relock(project)
    (project.path / "impl" / "notes.txt").write_text("edited freely\n")
    project.runpytest("--ditgate").assert_outcomes(passed=1)
    (project.path / "impl" / "base.py").write_text("X = 2\n")
    project.runpytest().assert_outcomes(passed=1)  # no --ditgate: no gate, no lock check


def test_relock_after_a_change_reports_it_then_passes(project: pytest.Pytester) -> None:
    relock(project)
    (project.path / "impl" / "base.py").write_text("X = 2\n")
    result = relock(project)
    result.stdout.fnmatch_lines(["*fixed paths changed before this --ditgate-relock run:*", "*edited:  impl/base.py*",
                                 "*RELOCKED*"])
    project.runpytest("--ditgate").assert_outcomes(passed=1)


def test_golden_tensor_edit_is_caught_and_freeze_relocks(pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", pyproject=PYPROJECT.format(paths='"golden/"'))
    pytester.makepyfile(test_gold="""
        import torch
        def test_g(golden):
            golden.check("g", {"x": torch.ones(3)})
    """)
    result = pytester.runpytest("--ditgate", "--ditgate-freeze")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*no fixed-paths lock*", "*RELOCKED*(3 files, --ditgate-freeze)*"])
    pytester.runpytest("--ditgate").assert_outcomes(passed=1)
    path = pytester.path / "golden" / "cpu" / "g.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    result = pytester.runpytest("--ditgate")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*edited:  golden/cpu/g.safetensors*"])


def test_relock_needs_ditgate_and_bad_setting_is_a_usage_error(project: pytest.Pytester) -> None:
    result = project.runpytest("--ditgate-relock")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--ditgate-relock needs --ditgate*"])
    project.makefile(".toml", pyproject='[tool.ditgate]\nfixed_paths = "fixtures/"\n')
    result = project.runpytest("--ditgate")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*fixed_paths must be a list of non-empty strings*"])


def test_expand_reuses_digests_taken_a_moment_before_and_hashes_the_rest(tmp_path) -> None:
    """The judge hashes the lock's files once before its child: the wider set it re-checks afterwards takes
    their digests as given and reads only the files the lock does not name."""
    import hashlib

    from pytest_ditgate.golden.fixed_paths import LockSettings, expand

    (tmp_path / "fixed").mkdir()
    (tmp_path / "golden").mkdir()
    (tmp_path / "fixed" / "a.py").write_text("a = 1\n")
    (tmp_path / "golden" / "manifest.json").write_text("{}\n")
    lock = LockSettings(tmp_path, ("fixed/",), tmp_path / "golden" / "fixed_paths.lock.json")
    first = expand(lock)
    assert first == {"fixed/a.py": hashlib.sha256(b"a = 1\n").hexdigest()}
    wider = LockSettings(tmp_path, ("fixed/", "golden/"), lock.lock_path)
    marked = {"fixed/a.py": "given"}
    assert expand(wider, marked) == {"fixed/a.py": "given",
                                     "golden/manifest.json": hashlib.sha256(b"{}\n").hexdigest()}
    assert expand(wider)["fixed/a.py"] == first["fixed/a.py"]  # without known digests every file is read
