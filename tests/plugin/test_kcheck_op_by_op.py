"""Op-by-op half-precision math: an output the reference's own bf16/fp16 run fails the fp32-accumulator bound
on is judged with every intermediate rounded at that precision (correctness/stepwise.py), so torch's own eager
bf16 code passes against itself; a wrong scale hidden in that wider allowance still fails, as does a candidate
where the reference's own run passes.

Each honest case failed before the op-by-op step: torch's bf16 cross entropy at 1.26 x its elementwise
allowance on every seed, HF RoPE in the mixed trial at 1.6-2.9 x, a softmax backward from its saved bf16 output
at 4.4 x and more.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pytest_ditgate import GateFailure, check_kernel
from pytest_ditgate.correctness.inputs import make_tensor
from test_tolerance_corpus_llm import ce_non_target_scaled  # fp32 math, every non-target column scaled

ROWS, VOCAB = 16, 8000


def cross_entropy(logits, target):
    """torch's own cross entropy, forward and backward (op by op at the inputs' precision)."""
    x = logits.detach().requires_grad_()
    loss = F.cross_entropy(x, target, ignore_index=-100)
    loss.backward()
    return loss.detach(), x.grad


def ce_inputs(dtype: str, ignored: bool = True):
    def make(seed):
        target = make_tensor((ROWS,), "int64", seed=seed + 1, low=0, high=VOCAB)
        if ignored:
            target[::4] = -100
        return make_tensor((ROWS, VOCAB), dtype, seed=seed), target
    return make


def judged_op_by_op(report) -> set[str]:
    return {o.honest.op_by_op for t in report.trials + report.extremal_trials for o in t.outputs
            if o.honest is not None and o.honest.op_by_op is not None}


def test_torchs_own_cross_entropy_passes_against_itself() -> None:
    report = check_kernel(cross_entropy, cross_entropy, ce_inputs("bfloat16"), trials=3, input_scales=())
    assert report.passed and judged_op_by_op(report) == {"bfloat16"}


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), -1)


def hf_rope(q, cos, sin):
    return q * cos + _rotate_half(q) * sin


def rope_inputs(seed):
    inverse = 1.0 / (10000 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64))
    angles = torch.arange(128, dtype=torch.float64)[:, None] * inverse[None]
    angles = torch.cat((angles, angles), -1)
    return make_tensor((2, 4, 128, 64), "bfloat16", seed=seed), torch.cos(angles).bfloat16(), \
        torch.sin(angles).bfloat16()


def test_hf_rope_in_bf16_passes_the_mixed_trial() -> None:
    """Two products near 1e3 rounded to bf16 (spacing 4 to 8) and added to about 60."""
    for seed in (0, 2, 5):
        assert check_kernel(hf_rope, hf_rope, rope_inputs, seed=seed, trials=1, scaled_args=(0,)).passed


def softmax_reference(x, dy):
    x = x.detach().requires_grad_()
    y = torch.softmax(x, -1)
    y.backward(dy)
    return y.detach(), x.grad


def softmax_from_saved_output(x, dy):
    """A fused kernel's pattern: fp32 math, the probabilities saved in the inputs' dtype for the backward."""
    y = torch.softmax(x.float(), -1).to(x.dtype)
    yf, dyf = y.float(), dy.float()
    return y, (yf * (dyf - (yf * dyf).sum(-1, keepdim=True))).to(x.dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_softmax_backward_from_its_saved_output_passes_at_every_scale(dtype: str) -> None:
    """In fp16 the mixed trial's probabilities underflow where torch's own fp16 run flushes them too."""
    make = lambda s: (make_tensor((64, 1024), dtype, seed=s), make_tensor((64, 1024), dtype, seed=s + 1))  # noqa: E731
    for seed in (0, 202):
        assert check_kernel(softmax_from_saved_output, softmax_reference, make, seed=seed, trials=1).passed
        assert check_kernel(softmax_reference, softmax_reference, make, seed=seed, trials=1).passed


@pytest.mark.parametrize("factor", [1.1, 1.05])
def test_a_wrong_scale_within_op_by_op_noise_leans_one_way_and_fails(factor: float) -> None:
    """Every row's small elements err the same way: rounding noise leans up or down at random, row by row."""
    with pytest.raises(GateFailure) as failure:
        check_kernel(ce_non_target_scaled(factor), cross_entropy, ce_inputs("bfloat16", ignored=False), trials=2,
                     input_scales=())
    assert failure.value.reason == "mismatch"
    assert "not judged op by op at bfloat16: in 16 of the 16 rows" in failure.value.message


def test_with_two_rows_a_wrong_scale_still_fails() -> None:
    """Two rows are too few to tell a row's shared rounding from a wrong scale: a lean is not excused there."""
    make = lambda s: (make_tensor((2, VOCAB), "bfloat16", seed=s), make_tensor((2,), "int64", seed=s, low=0, high=VOCAB))  # noqa: E731,E501
    with pytest.raises(GateFailure) as failure:
        check_kernel(ce_non_target_scaled(1.1), cross_entropy, make, trials=2, input_scales=())
    assert failure.value.reason == "mismatch"


@pytest.mark.parametrize("wrong", ["one row x1.03", "1% noise", "loss x1.01"])
def test_wrong_cross_entropies_still_fail(wrong: str) -> None:
    def kernel(logits, target):
        loss, grad = cross_entropy(logits, target)
        if wrong == "one row x1.03":
            grad = grad.clone()
            grad[5] *= 1.03
        elif wrong == "1% noise":
            noise = 1 + 0.01 * torch.randn(grad.shape, generator=torch.Generator().manual_seed(0))
            grad = (grad.float() * noise).to(grad.dtype)
        else:
            loss = (loss.float() * 1.01).to(loss.dtype)
        return loss, grad

    with pytest.raises(GateFailure) as failure:
        check_kernel(kernel, cross_entropy, ce_inputs("bfloat16"), trials=2, input_scales=())
    assert failure.value.reason in ("mismatch", "rounding_bias")


def test_where_the_references_own_run_passes_the_fp32_accumulator_bound_holds() -> None:
    """A bf16 GEMM: torch's own bf16 matmul sums in fp32 and passes, so a 2 % scale is judged by the usual
    bound, with no op-by-op allowance."""
    make = lambda s: (make_tensor((64, 1024), "bfloat16", seed=s), make_tensor((1024, 64), "bfloat16", seed=s + 1))  # noqa: E731,E501
    with pytest.raises(GateFailure) as failure:
        check_kernel(lambda a, b: (a @ b) * 1.02, lambda a, b: a @ b, make, trials=1)
    assert not judged_op_by_op(failure.value.report)
