"""Poison: scratch arguments hold garbage on entry to every call, and a NaN the kernel computes is told from poison.

A workspace declared in ``scratch_args`` is filled with ``0xFF`` bytes before the first call and ``0x7F`` bytes
before the second: a kernel that accumulates into a workspace it never zeroes fails, with a message saying how to
declare a workspace that must be zeroed; kernels that zero their workspace themselves, or take it as an in-out
argument and leave it as they found it, pass. A bf16 NaN converted on the CPU has the poison's bits (``0xFFFF``):
an overflowing softmax fails ``nonfinite``, while outputs left unwritten (in either call) still fail
``stale_output``.
"""

from __future__ import annotations

import pytest

from kcheck_suites import run_suite

SCRATCH = '''
import torch
from pytest_ditgate.correctness.inputs import make_tensor


def row_sums(x, workspace):
    return x.sum(-1)


def accumulates(x, workspace):             # WRONG: adds into the workspace and never zeroes it
    workspace[:, 0] += x.float().sum(-1)
    return workspace[:, 0].to(x.dtype)


def zeroes_first(x, workspace):            # HONEST: zeroes its workspace, then accumulates (and returns a copy:
    workspace.zero_()                       # .to() of a float32 view is the view, the workspace itself)
    workspace[:, 0] += x.float().sum(-1)
    return workspace[:, 0].to(x.dtype, copy=True)


def leaves_it_zeroed(x, workspace):        # HONEST for a zeroed in-out workspace: zero again on the way out
    workspace[:, 0] += x.float().sum(-1)
    out = workspace[:, 0].to(x.dtype, copy=True)
    workspace.zero_()
    return out


def softmax_in_workspace(x, workspace):    # HONEST: overwrites the workspace before reading it
    workspace.copy_(torch.exp(x.float() - x.float().amax(-1, keepdim=True)))
    return (workspace / workspace.sum(-1, keepdim=True)).to(x.dtype)


def inputs(dtype):
    return lambda seed: (make_tensor((64, 4096), dtype, seed=seed), torch.zeros(64, 1))


def test_accumulates_into_scratch_fp32(kernel_check):
    kernel_check(accumulates, row_sums, inputs("float32"), scratch_args=(1,))


def test_accumulates_into_scratch_bf16(kernel_check):
    kernel_check(accumulates, row_sums, inputs("bfloat16"), scratch_args=(1,))


def test_accumulates_into_an_in_out_workspace(kernel_check):
    kernel_check(accumulates, row_sums, inputs("float32"), inout_args=(1,))


def test_honest_zeroes_its_scratch(kernel_check):
    for dtype in ("float32", "bfloat16"):
        kernel_check(zeroes_first, row_sums, inputs(dtype), scratch_args=(1,))


def test_honest_zeroed_in_out_workspace(kernel_check):
    for dtype in ("float32", "bfloat16"):
        kernel_check(leaves_it_zeroed, row_sums, inputs(dtype), inout_args=(1,))


def test_honest_softmax_workspace(kernel_check):
    for dtype in ("float32", "bfloat16"):
        kernel_check(softmax_in_workspace, lambda x, workspace: torch.softmax(x, -1),
                     lambda s: (make_tensor((16, 4096), dtype, seed=s), make_tensor((16, 4096), seed=s + 1)),
                     scratch_args=(1,))
'''


def test_scratch_contents_are_unspecified_on_entry(pytester: pytest.Pytester) -> None:
    out = run_suite(pytester, SCRATCH, passed=3, failed={"accumulates": "stale_output"})
    for name in ("test_accumulates_into_scratch_fp32", "test_accumulates_into_scratch_bf16",
                 "test_accumulates_into_an_in_out_workspace"):
        assert f"FAILED test_suite.py::{name}" in out
    assert failure_lines(out, "scratch_args (arg1) hold unspecified contents on entry to every call") == 2
    assert "a kernel that needs a zeroed workspace zeroes it itself, or takes it as an in-out argument" in out
    assert "in-out arg1 differs from the reference" in out  # the in-out workspace left dirty


def failure_lines(out: str, text: str) -> int:
    """How many lines of the failures' sections hold ``text`` (the short summary repeats a failure's first line
    whole where pytest does not clip it, as under CI=true)."""
    return sum(text in line for line in out.splitlines() if line.startswith("E "))


NAN_OR_POISON = '''
import torch
from pytest_ditgate.correctness.inputs import make_tensor


def softmax(x):
    return torch.softmax(x, -1)


def softmax_without_max(x):                # WRONG: exp overflows at x100 -> inf/inf = NaN (0xFFFF in bf16)
    e = torch.exp(x.float())
    return (e / e.sum(-1, keepdim=True)).to(x.dtype)


def softmax_fp32(x):                       # HONEST
    return torch.softmax(x.float(), -1).to(x.dtype)


def half_written(x):                       # WRONG: leaves the second half of each row unwritten
    out = torch.empty_like(x)
    half = x.shape[-1] // 2
    out[:, :half] = softmax_fp32(x)[:, :half]
    return out


def unwritten_on_its_second_call(x, calls=[]):   # WRONG: its second call leaves the last column unwritten
    calls.append(1)
    out = torch.empty_like(x)
    width = x.shape[-1] - (len(calls) % 2 == 0)
    out[:, :width] = softmax_fp32(x)[:, :width]
    return out


def rows(dtype):
    return lambda seed: (make_tensor((64, 4096), dtype, seed=seed),)


def test_overflowing_softmax_is_nonfinite(kernel_check):
    for dtype in ("bfloat16", "float32"):
        try:
            kernel_check(softmax_without_max, softmax, rows(dtype), input_scales=(100.0,))
        except AssertionError as failure:
            assert failure.reason == "nonfinite", failure
        else:
            raise AssertionError("passed")


def test_honest_softmax_at_x100(kernel_check):
    for dtype in ("bfloat16", "float32"):
        kernel_check(softmax_fp32, softmax, rows(dtype), input_scales=(100.0,))


def test_half_written_bf16(kernel_check):
    kernel_check(half_written, softmax, rows("bfloat16"))


def test_half_written_bf16_one_call(kernel_check):
    kernel_check(half_written, softmax, rows("bfloat16"), check_determinism=False)


def test_unwritten_on_the_second_call(kernel_check):
    kernel_check(unwritten_on_its_second_call, softmax, rows("float32"))
'''


def test_a_computed_nan_is_nonfinite_and_unwritten_elements_stay_stale(pytester: pytest.Pytester) -> None:
    out = run_suite(pytester, NAN_OR_POISON, passed=2, failed={"half_written": "stale_output",
                                                                "unwritten_on_its_second_call": "stale_output"})
    assert failure_lines(out, "[stale_output] kernel_check 'half_written' failed") == 2
    assert ("131072 of 262144 elements of out still hold the poison pattern of its call (0xFF bytes before the first "
            "call, 0x7F before the second)") in out
    assert "still hold the poison pattern (0xFF bytes)" in out  # one call only (check_determinism=False)
