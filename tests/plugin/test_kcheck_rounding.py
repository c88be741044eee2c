"""``rounding_bias`` per region, and the reference's own bias excusing only a bias like it.

Directed rounding confined to part of a 16-bit output (the last 40 of 1000 columns of a GEMM, the last rows of a
LayerNorm) fails, named by its block of columns or rows, where over the whole output it averaged away. A bias the
reference's own bf16 run shows excuses the candidate's only in the same direction and of about the same size: a
truncating RMSNorm at batch 1, and one rounding toward +inf, fail, where any 0.05 ulp of the reference's own run
used to excuse them. Honest kernels beside them pass: round-to-nearest GEMMs, LayerNorms and RMSNorms at rows of
4096 in bf16 and fp16, stochastic rounding, the op-by-op bf16 RMSNorm the reference itself computes, and a softmax
whose bf16 normaliser the reference rounds the same way.
"""

from __future__ import annotations

import pytest

from kcheck_suites import run_suite

ROUNDING = '''
import torch
import torch.nn.functional as F
from pytest_ditgate.correctness.inputs import make_tensor


def toward_zero(t):                        # float32 -> bf16 by dropping the low 16 bits
    return (t.float().contiguous().view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)


def toward_plus_inf(t):                    # float32 -> bf16, rounded up
    bits = t.float().contiguous().view(torch.int32)
    up = torch.where(t > 0, (bits + 0xFFFF) & ~0xFFFF, bits & ~0xFFFF)
    return up.view(torch.float32).to(torch.bfloat16)


def gemm(a, b):
    return a @ b


def gemm_inputs(seed):
    return make_tensor((256, 1024), "bfloat16", seed=seed), make_tensor((1024, 1000), "bfloat16", seed=seed + 1)


def gemm_tail_truncates(a, b):             # WRONG: the last tile's epilogue (40 of 1000 columns) truncates
    out = a.float() @ b.float()
    result = out.to(torch.bfloat16)
    result[:, 960:] = toward_zero(out[:, 960:])
    return result


def gemm_nearest(a, b):                    # HONEST
    return (a.float() @ b.float()).to(a.dtype)


def layer_norm(x):
    return F.layer_norm(x, x.shape[-1:], eps=1e-5)


def rows(dtype, count=64):
    return lambda seed: (make_tensor((count, 4096), dtype, seed=seed),)


def layer_norm_tail_rows_truncate(x):      # WRONG: the last 4 of 64 rows (6 %) truncated
    out = layer_norm(x.float())
    result = out.to(x.dtype)
    result[-4:] = toward_zero(out[-4:]).to(x.dtype)
    return result


def layer_norm_fp16_tail_rows_low(x):      # WRONG: fp16, the last 8 of 64 rows rounded down
    out = layer_norm(x.float())
    result = out.to(x.dtype)
    near = result[-8:]
    step = torch.where(near > 0, -1, 1).to(torch.int16)  # one value down: its bit pattern -1 (+1 below zero)
    high = near.float() > out[-8:]
    result[-8:] = (near.view(torch.int16) + torch.where(high, step, torch.zeros_like(step))).view(x.dtype)
    return result


def layer_norm_fp32_math(x):               # HONEST
    return layer_norm(x.float()).to(x.dtype)


def gelu_stochastic(x):                    # HONEST: stochastic rounding to bf16
    y = F.gelu(x.float())
    noise = torch.randint(0, 1 << 16, y.shape, generator=torch.Generator().manual_seed(7), dtype=torch.int32)
    return ((y.view(torch.int32) + noise) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)


def rms_reference(x, w):                   # the README's RMSNorm reference, verbatim
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def rms_fp32(x, w):
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()


def rms_truncating(x, w):                  # WRONG: fp32 math, then the low 16 bits dropped
    return toward_zero(rms_fp32(x, w))


def rms_toward_plus_inf(x, w):             # WRONG: fp32 math, rounded toward +inf
    return toward_plus_inf(rms_fp32(x, w))


def rms_nearest(x, w):                     # HONEST
    return rms_fp32(x, w).to(x.dtype)


def rms_inputs(count):                     # count tokens, hidden 4096
    return lambda seed: (make_tensor((count, 4096), "bfloat16", seed=seed),
                         make_tensor((4096,), "bfloat16", seed=seed + 1000))


def softmax_rounding_its_sum(x):           # the reference written for any dtype: in bf16 its sum is rounded
    e = x.exp()
    return e / e.sum(-1, keepdim=True)


def softmax_bf16_sum(x):                   # HONEST where the reference rounds the sum the same way
    e = x.float().exp()
    return (e / e.sum(-1, keepdim=True).bfloat16().float()).bfloat16()


def test_gemm_tail_truncates(kernel_check):
    kernel_check(gemm_tail_truncates, gemm, gemm_inputs, input_scales=())


def test_layer_norm_tail_rows_truncate(kernel_check):
    kernel_check(layer_norm_tail_rows_truncate, layer_norm, rows("bfloat16"), input_scales=())


def test_layer_norm_fp16_tail_rows_low(kernel_check):
    kernel_check(layer_norm_fp16_tail_rows_low, layer_norm, rows("float16"), input_scales=())


def test_rms_truncating_batch1(kernel_check):
    kernel_check(rms_truncating, rms_reference, rms_inputs(1))


def test_rms_toward_plus_inf_batch1(kernel_check):
    kernel_check(rms_toward_plus_inf, rms_reference, rms_inputs(1))


def test_honest_gemm(kernel_check):
    kernel_check(gemm_nearest, gemm, gemm_inputs, trials=3)


def test_honest_norms(kernel_check):
    for dtype in ("bfloat16", "float16"):
        kernel_check(layer_norm_fp32_math, layer_norm, rows(dtype))
    kernel_check(gelu_stochastic, F.gelu, rows("bfloat16"), check_determinism=False)


def test_honest_rmsnorms(kernel_check):
    for count in (1, 64):
        kernel_check(rms_nearest, rms_reference, rms_inputs(count))
        kernel_check(rms_reference, rms_reference, rms_inputs(count))  # op-by-op bf16: the reference's own run


def test_honest_softmax_whose_reference_rounds_the_same(kernel_check):
    kernel_check(softmax_bf16_sum, softmax_rounding_its_sum, rows("bfloat16"), input_scales=())
'''


def test_directed_rounding_in_part_of_the_output_fails_and_honest_rounding_passes(pytester: pytest.Pytester) -> None:
    out = run_suite(pytester, ROUNDING, passed=4, failed={
        "gemm_tail_truncates": "rounding_bias", "layer_norm_tail_rows_truncate": "rounding_bias",
        "layer_norm_fp16_tail_rows_low": "rounding_bias", "rms_truncating": "rounding_bias",
        "rms_toward_plus_inf": "rounding_bias"})
    assert "failed: rounding_bias: out rounds toward zero in columns 9" in out  # a block of the last 40 columns
    assert "failed: rounding_bias: out rounds toward zero in row 6" in out  # one of the last 4 rows
    assert "failed: rounding_bias: out rounds toward -inf in row" in out or \
        "failed: rounding_bias: out rounds toward zero in row" in out
    assert "failed: rounding_bias: out rounds toward +inf" in out
    assert "(trial 1 of 5, seed 0;" in out.split("kernel_check 'rms_truncating' failed")[1].splitlines()[0]
