"""The precision probe at degenerate shapes: a reference that moves by its own float64 rounding is not a move
an honest kernel must follow; real downgrades there are still caught; a bf16 accumulator is named as a cause.

LayerNorm's input gradient at a normalised dimension of 1 is exactly 0: a fused fp32 kernel returns 0, and
torch's float64 backward returns 0.0 at the trial's inputs and -1.78e-15 (a difference of O(1) terms, rounded)
at the inputs the probe moved within their cells. That move is thousands of fp32 spacings at 1e-15, so the
probe counted it as one an honest kernel's output follows, and called the exact kernel downgraded (fp32 2x1
at seed 30 and 34, bf16 8x1 at seed 10: 2 of 240 cases of a red-team sweep). Now, where an output looks
unmoved, the reference's own rounding noise is measured (``correctness/reference_noise.py``) and a move within
64 times it does not count. RMSNorm's backward and an outer product (K = 1) read as bf16, at the same
degenerate shapes, still fail ``precision_downgrade``; LayerNorm with bf16 reads fails ``mismatch``.

An fp32 GEMM or row sum that reads its inputs in full but adds them in a bf16 accumulator fails
``precision_downgrade`` too, and the message names both causes (a coarse read or a coarse accumulator)
instead of claiming the inputs were read at that precision.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from kcheck_suites import run_suite

torch = pytest.importorskip("torch")

DEGENERATE = '''
import pytest
import torch
import torch.nn.functional as F
from pytest_ditgate.correctness.inputs import make_tensor


def bf(t):
    return t.bfloat16().float()


def layernorm_ref(x, w, b, dy):
    x, w, b = (t.detach().requires_grad_() for t in (x, w, b))
    y = F.layer_norm(x, x.shape[-1:], w, b, 1e-5)
    y.backward(dy)
    return y.detach(), x.grad, w.grad, b.grad


def layernorm_fused(x, w, b, dy):           # HONEST: a fused kernel's formulas, fp32 math
    xf, wf, bf_, dyf = x.float(), w.float(), b.float(), dy.float()
    xc = xf - xf.mean(-1, keepdim=True)
    rstd = torch.rsqrt((xc * xc).mean(-1, keepdim=True) + 1e-5)
    xhat = xc * rstd
    g = dyf * wf
    dx = rstd * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
    return ((xhat * wf + bf_).to(x.dtype), dx.to(x.dtype), (dyf * xhat).sum(0).to(w.dtype),
            dyf.sum(0).to(b.dtype))


def layernorm_bf16_reads(x, w, b, dy):      # WRONG: reads its fp32 inputs as bf16
    return layernorm_fused(bf(x), bf(w), bf(b), bf(dy))


def layernorm_inputs(rows, dtype):
    return lambda s: (make_tensor((rows, 1), dtype, seed=s), make_tensor((1,), dtype, seed=s + 1),
                      make_tensor((1,), dtype, seed=s + 3), make_tensor((rows, 1), dtype, seed=s + 2))


def rmsnorm_ref(x, w, dy):
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    y.backward(dy)
    return y.detach(), x.grad, w.grad


def rmsnorm_bf16_reads(x, w, dy):           # WRONG: reads its fp32 inputs as bf16
    return rmsnorm_ref(bf(x), bf(w), bf(dy))


def rmsnorm_inputs(seed):
    return (make_tensor((64, 1), "float32", seed=seed), make_tensor((1,), "float32", seed=seed + 1),
            make_tensor((64, 1), "float32", seed=seed + 2))


def outer(a, b):
    return a @ b


def outer_inputs(seed):                      # a GEMM with K = 1
    return make_tensor((64, 1), "float32", seed=seed), make_tensor((1, 64), "float32", seed=seed + 9)


@pytest.mark.parametrize("rows, dtype, seed, trials", [
    (2, "float32", 34, 1), (2, "float32", 30, 1), (8, "bfloat16", 10, 5), (2, "float32", 0, 5),
    (8, "float32", 20, 5), (64, "float32", 40, 5), (8, "bfloat16", 50, 5)])
def test_honest_layernorm_at_dimension_1(kernel_check, rows, dtype, seed, trials):
    kernel_check(layernorm_fused, layernorm_ref, layernorm_inputs(rows, dtype), seed=seed, trials=trials)


def test_layernorm_bf16_reads(kernel_check):
    kernel_check(layernorm_bf16_reads, layernorm_ref, layernorm_inputs(8, "float32"))


def test_rmsnorm_backward_bf16_reads(kernel_check):
    kernel_check(rmsnorm_bf16_reads, rmsnorm_ref, rmsnorm_inputs)


def test_outer_product_bf16_reads(kernel_check):
    kernel_check(lambda a, b: bf(a) @ bf(b), outer, outer_inputs, label="outer_bf16")
'''


def test_an_exact_zero_gradient_passes_and_downgrades_at_degenerate_shapes_fail(pytester: pytest.Pytester) -> None:
    out = run_suite(pytester, DEGENERATE, passed=7, failed={
        "layernorm_bf16_reads": "mismatch", "rmsnorm_bf16_reads": "precision_downgrade",
        "outer_bf16": "precision_downgrade"})
    assert "the reference's own rounding noise measured on the moved inputs" in out  # measured, still downgraded


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


def _judge(ref_after: "torch.Tensor", own: "torch.Tensor | None") -> str:
    from pytest_ditgate.correctness import sensitivity

    zeros = torch.zeros(8, dtype=torch.float32)
    return sensitivity.judge("out", zeros, zeros.clone(), torch.zeros(8, dtype=torch.float64), ref_after,
                             scaled_error=0.0, own_noise=own).status


def test_a_move_within_the_references_own_noise_does_not_count() -> None:
    moved = torch.full((8,), -1.78e-15, dtype=torch.float64)  # float64 rounding of O(1) terms
    assert _judge(moved, None) == "precision_downgrade"       # what the probe said before
    assert _judge(moved, torch.full((8,), 1e-15, dtype=torch.float64)) == "inconclusive"
    real = torch.full((8,), 1e-4, dtype=torch.float64)          # a real move stays one, noise or not
    assert _judge(real, torch.full((8,), 1e-15, dtype=torch.float64)) == "precision_downgrade"
    assert _judge(real, torch.full((8,), float("inf"), dtype=torch.float64)) == "inconclusive"  # unstable there


def test_the_references_own_noise_is_measured_and_pooled_where_the_output_is_zero_by_structure() -> None:
    from pytest_ditgate.correctness import reference_noise
    from pytest_ditgate.correctness.conditioning import RoundingNoise

    def layernorm_dx(x, w, dy):               # zero by structure at a normalised dimension of 1
        x = x.detach().requires_grad_()
        torch.nn.functional.layer_norm(x, x.shape[-1:], w, None, 1e-5).backward(dy)
        return x.grad

    inputs = [torch.randn(64, 1, dtype=torch.float64), torch.randn(1, dtype=torch.float64),
              torch.randn(64, 1, dtype=torch.float64)]
    exact = layernorm_dx(*inputs)

    def run(mode: RoundingNoise) -> list:
        with mode:
            return [("dx", layernorm_dx(*[mode.perturb(t.clone()) for t in inputs]))]

    noise = reference_noise.measure(run, {"dx": exact}, dtype=torch.float64, seed=0)["dx"]
    assert noise.shape == exact.shape and bool((noise > 0).all())  # pooled: no element left at 0
    assert float(noise.max()) < 1e-12                              # float64 rounding of O(1)-O(300) terms
    smooth = {"y": torch.linspace(1, 2, 64, dtype=torch.float64)}

    def run_smooth(mode: RoundingNoise) -> list:
        with mode:
            return [("y", mode.perturb(torch.linspace(1, 2, 64, dtype=torch.float64)) * 3.0)]

    own = reference_noise.measure(run_smooth, {"y": smooth["y"] * 3.0}, dtype=torch.float64, seed=0)["y"]
    assert float(own.max()) < 64 * torch.finfo(torch.float64).eps * 6  # a few ulps of the value, not more


def test_the_new_modules_import_no_torch() -> None:
    code = ("import sys; import pytest_ditgate.correctness.reference_noise, "
            "pytest_ditgate.correctness.sensitivity, pytest_ditgate.correctness.precision_probe; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
