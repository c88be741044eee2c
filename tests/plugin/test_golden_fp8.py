"""An fp8 output can be frozen and checked: the golden store's finiteness check read fp8 tensors with
torch.isfinite, which fp8 lacks (a NotImplementedError traceback at freeze)."""

from __future__ import annotations

import pytest

TEST = """
import torch

def test_fp8(golden):
    y = (torch.arange(12, dtype=torch.float32) / 4).to(torch.float8_e4m3fn)
    golden.check("f8", {"y": y}, device="cpu")
"""


def test_an_fp8_golden_freezes_and_checks(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_f8=TEST)
    frozen = pytester.runpytest_subprocess("--ditgate", "--ditgate-freeze", "-p", "no:cacheprovider")
    frozen.assert_outcomes(passed=1)
    checked = pytester.runpytest_subprocess("--ditgate", "-p", "no:cacheprovider")
    checked.assert_outcomes(passed=1)
