"""How golden failures read: the test's line and the message, without pluggy's frames (whose locals held the
tensors' values) between the plugin's own; a dtype change's remedy whole; a malformed freeze journal with what
to do about it."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest("--ditgate", "-p", "no:cacheprovider", "-rf", *args)


MISMATCH = """
import os
import torch

SCALE = float(os.environ.get("SCALE", "1"))

def test_mismatch(golden):
    golden.check("g3", {"out": torch.linspace(0.0, 1.0, 4096).reshape(64, 64) * SCALE + 0.1234567})
"""


def test_a_golden_failure_shows_no_pluggy_frames_and_no_values(pytester: pytest.Pytester,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Every golden failure used to show pluggy's `_caller.py` and `_manager.py` frames, with the hook's kwargs:
    the tensors' values (`tensor([[0.1235, ...`)."""
    pytester.makepyfile(test_g=MISMATCH)
    run(pytester, "--ditgate-freeze").assert_outcomes(passed=1)
    monkeypatch.setenv("SCALE", "1.7")
    result = run(pytester)
    result.assert_outcomes(failed=1)
    text = result.stdout.str().split(" FAILURES ")[1]  # the header names pluggy's version
    result.stdout.fnmatch_lines([">       golden.check(*", "E   *[[]golden_mismatch[]] golden 'g3' for cpu does not match:",
                                 "E  *FAIL out: rel_l2 *", "", "test_g.py:7: GateFailure"])
    assert "/pluggy/" not in text and "_hookexec" not in text and "kwargs" not in text, text
    assert "tensor(" not in text and "0.1235" not in text and "1.8234" not in text, text
    result = run(pytester, "--full-trace")  # every frame, as documented
    assert "/pluggy/" in result.stdout.str().split(" FAILURES ")[1]


HOOK = """
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_ditgate_golden_check(name, tensors):
    if name == "refused":
        raise RuntimeError(f"my hook refuses {name}")
"""


def test_a_users_golden_hook_that_raises_keeps_its_frame(pytester: pytest.Pytester) -> None:
    """Only pluggy's frames between the plugin's own go: a hook implementation of the user's shows its line."""
    pytester.makeconftest(HOOK)
    pytester.makepyfile(test_g="""
        import torch
        def test_refused(golden):
            golden.check("refused", {"out": torch.ones(8)})
    """)
    result = run(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(['>*raise RuntimeError(f"my hook refuses {name}")', "E*RuntimeError: my hook refuses refused",
                                 "", "conftest.py:6: RuntimeError"])


DTYPE = """
import torch

def test_dtype(golden):
    out = torch.linspace(1.0, 2.0, 4096)
    golden.check("d", {"out": out if golden.mode != "check" else out.to(torch.bfloat16)})
"""


def test_the_dtype_change_remedy_is_whole(pytester: pytest.Pytester) -> None:
    """It was clipped mid-sentence: "...judges it at bfloat16's limit... (208 characters)"."""
    pytester.makepyfile(test_g=DTYPE)
    run(pytester, "--ditgate-freeze").assert_outcomes(passed=1)
    result = run(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["E  *FAIL out: dtype bfloat16 != golden float32: a dtype change is judged only when the "
                                 "check says so (golden.check(..., allow_dtype_change=True) judges it at bfloat16's "
                                 "limits), or refreeze the golden in bfloat16"])
    assert "characters)" not in result.stdout.str()


def test_a_long_tensor_name_is_clipped_and_the_remedy_kept(pytester: pytest.Pytester) -> None:
    """What the default comparator's line clips is the tensor's name (a value), never the remedy after it."""
    long_name = "t" * 300
    pytester.makepyfile(test_g=DTYPE.replace('"out"', '"t" * 300'))
    run(pytester, "--ditgate-freeze").assert_outcomes(passed=1)
    result = run(pytester)
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert long_name not in text and "(300 characters): dtype bfloat16 != golden float32" in text, text
    assert "or refreeze the golden in bfloat16" in text


COMPARE = """
import torch

class Loud:
    passed = False
    def lines(self):
        return ["x" * 1000]

def test_loud(golden):
    golden.check("c", {"out": torch.ones(8)}, compare=None if golden.mode != "check" else lambda c, h: Loud())
"""


def test_a_users_comparator_lines_are_still_clipped(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_g=COMPARE)
    run(pytester, "--ditgate-freeze").assert_outcomes(passed=1)
    result = run(pytester)
    result.assert_outcomes(failed=1)
    assert "... (1000 characters)" in result.stdout.str() and "x" * 1000 not in result.stdout.str()


def test_a_malformed_freeze_journal_entry_says_what_to_do(pytester: pytest.Pytester) -> None:
    """It said "entry 0: malformed entry (missing ...)" and nothing more, where an unreadable journal says
    "remove it, then freeze again"."""
    pytester.makepyfile(test_g=DTYPE)
    run(pytester, "--ditgate-freeze").assert_outcomes(passed=1)
    journal = pytester.path / "golden" / ".freeze-journal.json"
    journal.write_text(json.dumps({"version": 1, "entries": [{"name": "d", "key": "cpu"}]}))
    result = run(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"E  *[[]golden_integrity[]] {journal} entry 0: malformed entry (missing file, sha256, "
                                 "size, tensors); remove it, then freeze again"])
