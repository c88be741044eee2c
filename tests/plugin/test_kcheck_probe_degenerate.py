"""The precision probe names a bf16 accumulator as a possible cause of a downgrade.

An fp32 GEMM or row sum that reads its inputs in full but adds them in a bf16 accumulator fails
``precision_downgrade`` (each rounding of the partial sum drops the probe's moves), and the message names both
causes (a coarse read or a coarse accumulator) instead of claiming the inputs were read at that precision.
"""

from __future__ import annotations

import pytest

from kcheck_suites import run_suite

ACCUMULATOR = '''
import torch
from pytest_ditgate.correctness.inputs import make_tensor


def gemm(a, b):
    return a @ b


def gemm_bf16_accumulator(a, b):            # WRONG: its inputs read in full, its partial sums kept in bf16
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.bfloat16)
    for k in range(0, a.shape[1], 32):
        acc = (acc.float() + a[:, k:k + 32] @ b[k:k + 32]).bfloat16()
    return acc.float()


def row_sums_bf16_accumulator(x):           # WRONG: the same for row sums of positive terms
    acc = torch.zeros(x.shape[0], dtype=torch.bfloat16)
    for k in range(0, x.shape[1], 64):
        acc = (acc.float() + x[:, k:k + 64].sum(-1)).bfloat16()
    return acc.float()


def test_gemm(kernel_check):
    kernel_check(gemm_bf16_accumulator, gemm, lambda s: (make_tensor((64, 512), "float32", seed=s),
                                                         make_tensor((512, 64), "float32", seed=s + 100)))


def test_row_sums(kernel_check):
    kernel_check(row_sums_bf16_accumulator, lambda x: x.sum(-1),
                 lambda s: (make_tensor((32, 4096), "float32", seed=s).abs(),))
'''


def test_a_bf16_accumulator_fails_and_the_message_names_both_causes(pytester: pytest.Pytester) -> None:
    out = run_suite(pytester, ACCUMULATOR, passed=0, failed={
        "gemm_bf16_accumulator": "precision_downgrade", "row_sums_bf16_accumulator": "precision_downgrade"})
    flat = " ".join(out.split())
    assert ("the candidate computes it at that precision or coarser: it reads its inputs, or accumulates their "
            "terms, at such a precision (the probe cannot tell which)") in flat
    assert "the candidate reads its inputs at that precision or coarser" not in flat
