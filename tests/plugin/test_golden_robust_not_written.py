"""A golden a freeze could not write fails the test that froze it, not only the run: what a test froze is
written when the test ends, and a write refused (another xdist worker froze another value for the name first)
or failed (a store that cannot be written) is an error in that test's teardown (``golden_not_written``), which
the terminal, the short summary and JUnit XML all show. Honest freezes still pass and write every golden."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest("--ditgate", "-p", "no:cacheprovider", "-rfE", "--junitxml=junit.xml", *args)


def junit(pytester: pytest.Pytester) -> dict[str, list[str]]:
    """Each test case's name and the tags of its outcome children (``error``, ``failure``; none: passed)."""
    cases = ET.parse(pytester.path / "junit.xml").getroot().iter("testcase")
    return {case.get("name"): [child.tag for child in case if child.tag in ("error", "failure")] for case in cases}


TWO = """
import torch

def test_a(golden):
    golden.check("a", {"x": torch.linspace(0.0, 1.0, 4096)})

def test_b(golden):
    golden.check("b", {"x": torch.linspace(1.0, 2.0, 4096)})
"""


def test_a_store_that_cannot_be_written_errors_each_freezing_test(pytester: pytest.Pytester) -> None:
    """Every test used to report "passed" while the run failed; JUnit showed only passes. (A read-only folder
    is not read-only to root: a file where the key folder goes makes the write fail for anyone.)"""
    pytester.makepyfile(test_g=TWO)
    (pytester.path / "golden").mkdir()
    (pytester.path / "golden" / "cpu").write_text("not a folder")
    result = run(pytester, "--ditgate-freeze")
    result.assert_outcomes(passed=2, errors=2)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_a*",
                                 f"[[]golden_not_written[]] could not write goldens to {pytester.path / 'golden'}: *"
                                 "make the golden folder writable*then freeze again",
                                 "*ERROR at teardown of test_b*",
                                 "ERROR test_g.py::test_a - [[]golden_not_written[]] could not write goldens*",
                                 "ERROR test_g.py::test_b - [[]golden_not_written[]] could not write goldens*"])
    text = result.stdout.str()
    assert "_pytest/" not in text and "/pluggy/" not in text and "Traceback" not in text, text  # the message alone
    assert junit(pytester) == {"test_a": ["error"], "test_b": ["error"]}
    manifest = pytester.path / "golden" / "manifest.json"
    assert not manifest.exists() or json.loads(manifest.read_text())["entries"] == {}


def test_an_honest_freeze_writes_each_golden_when_its_test_ends(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_g=TWO, conftest="""
        import json, pathlib

        def pytest_runtest_setup(item):  # what the store lists when each test starts
            manifest = pathlib.Path("golden", "manifest.json")
            listed = sorted(json.loads(manifest.read_text())["entries"]) if manifest.exists() else []
            print(f"\\nlisted before {item.name}: {listed}")
    """)
    result = run(pytester, "--ditgate-freeze", "-s")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["listed before test_a: [[][]]", "listed before test_b: [[]'cpu/a'[]]"])
    assert junit(pytester) == {"test_a": [], "test_b": []}
    run(pytester).assert_outcomes(passed=2)


def test_a_name_refrozen_twice_in_one_run_is_written_once(pytester: pytest.Pytester,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The second check of a name compares with the first, written when its test ended: a refreeze never
    overwrites a golden it wrote in the same run."""
    pytester.makepyfile(test_g="""
        import os, torch

        def test_first(golden):
            golden.check("shared", {"x": torch.full((4096,), 1.0)})

        def test_second(golden):
            golden.check("shared", {"x": torch.full((4096,), float(os.environ.get("SECOND", "1.0")))})
    """)
    run(pytester, "--ditgate-freeze").assert_outcomes(passed=2)
    run(pytester, "--ditgate-refreeze").assert_outcomes(passed=2)
    monkeypatch.setenv("SECOND", "2.0")
    result = run(pytester, "--ditgate-refreeze")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["E  *[[]golden_mismatch[]] golden 'shared' for cpu (frozen earlier in this run by "
                                 "test_g.py::test_first) does not match:"])
    entries = json.loads((pytester.path / "golden" / "manifest.json").read_text())["entries"]
    assert entries["cpu/shared"]["provenance"]["test"] == "test_g.py::test_first"


@pytest.mark.slow  # two xdist workers each import torch: ~20 s on two shared cores
def test_the_worker_that_froze_a_name_second_with_another_value_errors(pytester: pytest.Pytester) -> None:
    """Under -n 2 the run failed while both tests reported "passed"; now the test whose value was not kept
    errors, naming both tests, and JUnit shows it."""
    pytest.importorskip("xdist")
    pytester.makepyfile(test_a="import torch\ndef test_a(golden):\n    golden.check('shared', {'x': torch.ones(3)})\n",
                        test_b="import torch\ndef test_b(golden):\n    golden.check('shared', {'x': torch.zeros(3) + 2})\n")
    result = run(pytester, "--ditgate-freeze", "-n", "2", "-p", "xdist", "--dist", "loadfile")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.assert_outcomes(passed=2, errors=1)
    outcomes = junit(pytester)
    loser = "test_b" if outcomes["test_b"] else "test_a"
    winner = "test_a" if loser == "test_b" else "test_b"
    assert outcomes == {winner: [], loser: ["error"]}, outcomes
    result.stdout.fnmatch_lines([f"ERROR {loser}.py::{loser} - [[]golden_not_written[]] golden 'cpu/shared' *"])
    text = result.stdout.str()
    assert "[golden_not_written] golden 'cpu/shared' was frozen by another run or worker while this one ran" in text
    assert f"({winner}.py::{winner}: pytest " in text and f"and {loser}.py::{loser} froze a different value" in text
