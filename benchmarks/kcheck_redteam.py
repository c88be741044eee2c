"""A red-team round on ``check_kernel``: honest kernels written differently from their reference must pass,
wrong ones must fail.

Each case is a candidate, a plain-PyTorch reference and ``make_inputs``, at realistic CPU sizes (fp32 and bf16
GEMMs with K = 2048..4096, rows of 4096 for row ops), checked with ``check_kernel``'s defaults (5 trials and the
3 extremal trials) plus the declarations a user would write (``inout_args``, ``out_args``, ``input_scales``).

- honest: split-K and blocked reductions with fp32 partials, another summation order, Welford against a two-pass
  variance, fused ops (bias + GELU, add + RMSNorm, online softmax, logsumexp, cross entropy forward and
  backward), bf16 kernels accumulating in fp32, declared in-place kernels (RoPE, a KV-cache append, an Adam
  step), degenerate shapes, outputs that cancel to nearly zero, integer outputs (argmax, top-k with ties);
- wrong: errors of 0.1 % to 1 % on some rows or columns, a wrong epsilon, GELU tanh for erf, a bias dropped on
  one block, an off-by-one in a row block, a softmax without its max subtraction, bf16 rounding inside an fp32
  kernel, bf16 weights with fp32 activations, split-K with bf16-rounded partials, an undeclared write, a read
  of an uninitialised output, an output that is a view of an input, a weight cache keyed by shape.

A *pass* of an honest case and a *catch* of a wrong one are the verdicts wanted; every other verdict is named
in the table (a false reject with its reason, an escape). Timer: ``time.perf_counter`` around each check.

    python benchmarks/kcheck_redteam.py --out benchmarks/results

writes ``kcheck_redteam_<arch>.json`` (with provenance) and prints the table last; exits 1 on a false reject
or an escape that is not a documented limit (``LIMITS``).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import harness

TIMER = "time.perf_counter around each whole check_kernel call"


@dataclass(frozen=True)
class Case:
    """One red-team case: ``honest`` kernels must pass, the others must fail (any reason, or ``expect``)."""

    name: str
    honest: bool
    candidate: Callable[..., Any]
    reference: Callable[..., Any]
    make_inputs: Callable[[int], Any]
    options: dict[str, Any] = field(default_factory=dict)
    expect: str | None = None  # the reason a wrong kernel should fail with, where one is the right one


#: escapes and false rejects that are documented limits of the gate (docs/kernel_check.md, "What the gate
#: cannot see"), with why: the script reports them and does not count them as regressions
LIMITS: dict[str, str] = {
    "bf16 gemm, 4 split-K partials rounded to bf16": "within one bf16 rounding per partial (precision probe limits)",
    "bf16 gemm x1.005 on 4 of 64 rows": "1.3 ulps on 6 % of the output: a region's mean bias under 0.1 ulp",
    "shape-specialised gemm (wrong for other M)": "the check runs the shapes make_inputs draws, no others",
    "fp32 bias+GELU, tanh for erf": "unscaled K=2048 weights: pre-activations ~45, GELU saturated on most outputs",
    "bf16 bias+GELU, tanh for erf": "the difference (<= 2e-4 absolute) is below one bf16 rounding",
    "top-8 indices with ties, stable sort": "indices are exact; torch.topk's tie order is not the kernel's",
    "top-8 values+indices with ties, stable sort": "indices are exact; torch.topk's tie order is not the kernel's",
}


def _t():
    import torch

    return torch


def _mk(shape, dtype="float32", seed=0, **kw):
    from pytest_ditgate.correctness.inputs import make_tensor

    return make_tensor(shape, dtype, seed=seed, **kw)


# ---------------------------------------------------------------- GEMM family (M x K @ K x N, + bias)

M, K, N = 64, 4096, 64


def gemm_inputs(dtype, m=M, k=K, n=N):
    return lambda s: (_mk((m, k), dtype, s), _mk((k, n), dtype, s + 1000))


def gemm_bias_inputs(dtype, m=M, k=2048, n=128, scaled=False):
    """A linear layer's inputs; ``scaled``: weights / sqrt(K), so the pre-activations are O(1) as in a network
    (unscaled, they are about sqrt(K) = 45 and GELU is saturated on most of them)."""
    def make(s):
        w = _mk((k, n), dtype, s + 1000)
        return _mk((m, k), dtype, s), (w / math.sqrt(k)).to(w.dtype) if scaled else w, _mk((n,), dtype, s + 2000)
    return make


def gemm(a, b):
    return a @ b


def split_k(parts, round_to=None):
    def kernel(a, b):
        torch = _t()
        acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float32)
        for ka, kb in zip(a.float().chunk(parts, 1), b.float().chunk(parts, 0)):
            part = ka @ kb
            acc += part if round_to is None else part.to(round_to).float()
        return acc.to(a.dtype)
    return kernel


def reversed_blocks(a, b):                      # HONEST: K in blocks of 128, added last block first
    torch = _t()
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float32)
    for ka, kb in reversed(list(zip(a.float().split(128, 1), b.float().split(128, 0)))):
        acc = acc + ka @ kb
    return acc.to(a.dtype)


def fp32_accumulate(a, b):                      # HONEST for bf16: fp32 math, one rounding at the end
    return (a.float() @ b.float()).to(a.dtype)


def rows_scaled(rows, factor):
    def kernel(a, b):
        out = (a.float() @ b.float())
        out[rows] *= factor
        return out.to(a.dtype)
    return kernel


def cols_scaled(cols, factor):
    def kernel(a, b):
        out = (a.float() @ b.float())
        out[:, cols] *= factor
        return out.to(a.dtype)
    return kernel


def linear(a, b, bias):
    return a @ b + bias


def gemm_then_bias(a, b, bias):                 # HONEST in bf16: the GEMM rounds, then the bias add rounds again
    return (a @ b) + bias


def gemm_then_bias_cols_scaled(a, b, bias):     # WRONG: columns 0-3 of the same output x1.01
    out = ((a @ b) + bias).float()
    out[:, :4] *= 1.01
    return out.to(a.dtype)


def bf16_weights(a, b):                         # WRONG: bf16 weights, fp32 activations
    return a @ b.bfloat16().float()


def tf32_like(a, b):                            # WRONG: operands rounded to 10 mantissa bits
    return a.half().float() @ b.half().float()


def bias_gelu(a, b, bias):
    torch = _t()
    return torch.nn.functional.gelu(a @ b + bias)


def fused_bias_gelu(a, b, bias):                # HONEST: erf GELU written out, fp32 math
    torch = _t()
    y = a.float() @ b.float() + bias.float()
    return (0.5 * y * (1.0 + torch.erf(y * (1.0 / math.sqrt(2.0))))).to(a.dtype)


def tanh_gelu(a, b, bias):                      # WRONG: the tanh approximation for an erf GELU
    torch = _t()
    return torch.nn.functional.gelu(a.float() @ b.float() + bias.float(), approximate="tanh").to(a.dtype)


def bias_dropped_on_block(a, b, bias):          # WRONG: the last 16 columns get no bias
    torch = _t()
    y = a.float() @ b.float()
    y[:, :-16] += bias.float()[:-16]
    return torch.nn.functional.gelu(y).to(a.dtype)


def bias_gelu_bf16_intermediate(a, b, bias):    # WRONG: the pre-activation rounded to bf16 in an fp32 kernel
    torch = _t()
    y = (a @ b + bias).bfloat16().float()
    return torch.nn.functional.gelu(y)


_WEIGHTS: dict = {}


def cached_weights(a, b):                       # WRONG: caches its (transposed) weight by shape
    key = tuple(b.shape)
    if key not in _WEIGHTS:
        _WEIGHTS[key] = b.t().contiguous()
    return a @ _WEIGHTS[key].t()


def shape_specialised(a, b):                    # WRONG for other shapes: drops the last row unless M == 64
    out = a @ b
    if a.shape[0] != 64:
        out[-1] = 0
    return out


_MEMO: dict = {}


def memoised_by_shape(a, b):                    # WRONG: right only for the first inputs it sees
    key = (tuple(a.shape), tuple(b.shape))
    if key not in _MEMO:
        _MEMO[key] = a @ b
    return _MEMO[key].clone()


def gemm_rows_miss_last_k(a, b):                # WRONG: rows 16-31 stop one term short of K
    out = a @ b
    out[16:32] = a[16:32, :-1] @ b[:-1]
    return out


def gemm_n1(a, b):                              # HONEST: matrix-vector as a sequential-order dot
    return (a.float() * b.float().t()).sum(-1, keepdim=True).to(a.dtype)


# ---------------------------------------------------------------- row ops over rows of 4096

R, D = 64, 4096


def row_inputs(dtype, rows=R, d=D):
    return lambda s: (_mk((rows, d), dtype, s),)


def rms_inputs(dtype, rows=R, d=D):
    return lambda s: (_mk((rows, d), dtype, s), _mk((d,), dtype, s + 1000))


def add_rms_inputs(dtype, rows=R, d=D):
    return lambda s: (_mk((rows, d), dtype, s), _mk((rows, d), dtype, s + 500), _mk((d,), dtype, s + 1000))


def rmsnorm(x, w, eps=1e-6):
    torch = _t()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rmsnorm_fp32(eps=1e-6):
    def kernel(x, w):
        xf = x.float()
        return (xf * _t().rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)
    return kernel


def rmsnorm_blocked(x, w):                      # HONEST: sum of squares in 16 blocks of 256, fp32 partials
    xf = x.float()
    ss = sum(c.pow(2).sum(-1, keepdim=True) for c in xf.chunk(16, -1))
    return (xf * _t().rsqrt(ss / x.shape[-1] + 1e-6) * w.float()).to(x.dtype)


def rmsnorm_bf16_weight(x, w):                  # WRONG: fp32 activations, the weight read as bf16
    xf = x.float()
    return xf * _t().rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.bfloat16().float()


def weighted_row_sums(x, w):
    return (x * w).sum(-1)


def weighted_row_sums_bf16_weight(x, w):        # WRONG: the weights read as bf16 (positive terms average it away)
    return (x * w.bfloat16().float()).sum(-1)


def positive_rms_inputs(s):
    return _mk((64, 4096), "float32", s, low=0.0, high=2.0), _mk((4096,), "float32", s + 1000, low=0.5, high=1.5)


def row_sums_blocked(x):                        # HONEST: rows of 4096 in 32 blocks, partials added in reverse
    parts = [c.sum(-1) for c in x.split(128, -1)]
    acc = _t().zeros_like(parts[0])
    for p in reversed(parts):
        acc = acc + p
    return acc


def rmsnorm_off_by_one(x, w):                   # WRONG: rows 32-47 average over d - 1 squares (the last missed)
    xf = x.float()
    ms = xf.pow(2).mean(-1, keepdim=True)
    ms[32:48] = xf[32:48, :-1].pow(2).sum(-1, keepdim=True) / x.shape[-1]
    return (xf * _t().rsqrt(ms + 1e-6) * w.float()).to(x.dtype)


def rmsnorm_rsqrt_bf16(x, w):                   # WRONG: the rsqrt factor rounded to bf16 in an fp32 kernel
    xf = x.float()
    r = _t().rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6).bfloat16().float()
    return xf * r * w


def add_rmsnorm(x, r, w):
    h = x + r
    return h, rmsnorm(h, w)


def add_rmsnorm_fused(x, r, w):                 # HONEST: residual add in fp32, one rounding of each output
    h = x.float() + r.float()
    y = h * _t().rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
    return h.to(x.dtype), y.to(x.dtype)


def add_rmsnorm_from_rounded(x, r, w):          # HONEST (HF-style): normalises the bf16-rounded residual
    h = (x.float() + r.float()).to(x.dtype)
    hf = h.float()
    y = hf * _t().rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
    return h, y.to(x.dtype)


def variance(x):
    return x.var(-1, unbiased=False)


def welford(x):                                 # HONEST: chunked Welford (Chan's merge), fp32
    torch = _t()
    xf = x.float()
    n = torch.zeros(x.shape[0], 1)
    mean = torch.zeros(x.shape[0], 1)
    m2 = torch.zeros(x.shape[0], 1)
    for c in xf.split(256, -1):
        nb = c.shape[-1]
        mb = c.mean(-1, keepdim=True)
        m2b = (c - mb).pow(2).sum(-1, keepdim=True)
        delta = mb - mean
        tot = n + nb
        mean = mean + delta * nb / tot
        m2 = m2 + m2b + delta.pow(2) * n * nb / tot
        n = tot
    return (m2 / n).squeeze(-1).to(x.dtype)


def unbiased_variance(x):                       # WRONG: divides by d - 1 (2.4e-4 relative at d = 4096)
    return x.float().var(-1, unbiased=True).to(x.dtype)


def layernorm(x, w, eps=1e-5):
    torch = _t()
    return torch.nn.functional.layer_norm(x, x.shape[-1:], w, None, eps)


def layernorm_welford(x, w):                    # HONEST: mean/var by Welford, normalise in fp32
    xf = x.float()
    var = welford(xf).unsqueeze(-1)
    return ((xf - xf.mean(-1, keepdim=True)) * _t().rsqrt(var + 1e-5) * w.float()).to(x.dtype)


def layernorm_bf16_steps(x, w):                 # HONEST: op by op in bf16 (mean, variance, rsqrt rounded per row)
    mu = x.mean(-1, keepdim=True)
    d = x - mu
    return d * _t().rsqrt(d.pow(2).mean(-1, keepdim=True) + 1e-5) * w


def layernorm_eps(eps):
    def kernel(x, w):
        xf = x.float()
        mu = xf.mean(-1, keepdim=True)
        var = (xf - mu).pow(2).mean(-1, keepdim=True)
        return ((xf - mu) * _t().rsqrt(var + eps) * w.float()).to(x.dtype)
    return kernel


def softmax(x):
    return _t().softmax(x, -1)


def online_softmax(x):                          # HONEST: one pass over blocks of 512, running max and sum
    torch = _t()
    xf = x.float()
    m = torch.full((x.shape[0], 1), -math.inf)
    s = torch.zeros(x.shape[0], 1)
    for c in xf.split(512, -1):
        mn = torch.maximum(m, c.amax(-1, keepdim=True))
        s = s * torch.exp(m - mn) + torch.exp(c - mn).sum(-1, keepdim=True)
        m = mn
    return (torch.exp(xf - m) / s).to(x.dtype)


def softmax_no_max(x):                          # WRONG: no max subtraction (overflows at large logits)
    e = _t().exp(x.float())
    return (e / e.sum(-1, keepdim=True)).to(x.dtype)


def logsumexp(x):
    return _t().logsumexp(x, -1)


def logsumexp_blocked(x):                       # HONEST: per-block max and sum, merged
    torch = _t()
    xf = x.float()
    parts = [torch.logsumexp(c, -1) for c in xf.split(1024, -1)]
    return torch.logsumexp(torch.stack(parts, -1), -1).to(x.dtype)


def logsumexp_no_max(x):                        # WRONG: log(sum(exp)) without the max
    return _t().exp(x.float()).sum(-1).log().to(x.dtype)


def ce_inputs(dtype, rows=32, vocab=4096):
    return lambda s: (_mk((rows, vocab), dtype, s), _mk((rows,), "int64", s + 1, low=0, high=vocab))


def cross_entropy_fwd_bwd(logits, target):      # the reference: autograd (float64 under the gate)
    torch = _t()
    x = logits.detach().requires_grad_()
    loss = torch.nn.functional.cross_entropy(x, target, reduction="none")
    loss.sum().backward()
    return loss.detach(), x.grad


def cross_entropy_fused(logits, target):        # HONEST: softmax-minus-one-hot gradient, fp32 math
    torch = _t()
    xf = logits.float()
    lse = torch.logsumexp(xf, -1)
    loss = lse - xf.gather(-1, target[:, None]).squeeze(-1)
    grad = torch.exp(xf - lse[:, None])
    grad[torch.arange(xf.shape[0]), target] -= 1.0
    return loss.to(logits.dtype), grad.to(logits.dtype)


def cross_entropy_no_max(logits, target):       # WRONG: log(sum(exp)) without the max subtraction
    torch = _t()
    xf = logits.float()
    e = torch.exp(xf)
    lse = e.sum(-1).log()
    loss = lse - xf.gather(-1, target[:, None]).squeeze(-1)
    grad = e / e.sum(-1, keepdim=True)
    grad[torch.arange(xf.shape[0]), target] -= 1.0
    return loss.to(logits.dtype), grad.to(logits.dtype)


def cross_entropy_grad_scaled(logits, target):  # WRONG: the gradient's non-target columns x1.005
    torch = _t()
    loss, grad = cross_entropy_fused(logits, target)
    g = grad.float() * 1.005
    rows = torch.arange(logits.shape[0])
    g[rows, target] = grad.float()[rows, target]
    return loss, g.to(logits.dtype)


# ---------------------------------------------------------------- in place: RoPE, KV cache, Adam


def rope_inputs(dtype):
    def make(s):
        torch = _t()
        q = _mk((4, 256, 8, 128), dtype, s)
        pos = torch.arange(256, dtype=torch.float64)[:, None]
        inv = 10000.0 ** (-torch.arange(0, 64, dtype=torch.float64) / 64)
        ang = pos * inv
        return q, ang.cos().to(q.dtype), ang.sin().to(q.dtype)
    return make


def rope_reference(q, cos, sin):                # rotate halves, in place
    half = q.shape[-1] // 2
    c, s = cos[:, None, :], sin[:, None, :]
    a, b = q[..., :half].clone(), q[..., half:].clone()
    q[..., :half] = a * c - b * s
    q[..., half:] = b * c + a * s


def rope_inplace(q, cos, sin):                  # HONEST: fp32 math, written back through a complex view
    torch = _t()
    half = q.shape[-1] // 2
    qf = q.float()
    z = torch.complex(qf[..., :half], qf[..., half:])
    rot = z * torch.complex(cos.float(), sin.float())[:, None, :]
    q[..., :half] = rot.real.to(q.dtype)
    q[..., half:] = rot.imag.to(q.dtype)


def rope_position_off(q, cos, sin):             # WRONG: positions 128.. use the angle of the position before
    cos2, sin2 = cos.clone(), sin.clone()
    cos2[128:], sin2[128:] = cos[127:-1], sin[127:-1]
    rope_inplace(q, cos2, sin2)


def kv_inputs(dtype):
    torch = _t()
    return lambda s: (_mk((2, 8, 512, 64), dtype, s), _mk((2, 8, 4, 64), dtype, s + 1), torch.tensor(s % 500))


def kv_append(cache, new, pos):
    p = int(pos)
    cache[:, :, p:p + new.shape[2]] = new


def kv_append_loop(cache, new, pos):            # HONEST: one position at a time
    p = int(pos)
    for i in range(new.shape[2]):
        cache[:, :, p + i].copy_(new[:, :, i])


def kv_append_clobbers(cache, new, pos):        # WRONG: also zeroes the slot after the appended ones
    p = int(pos)
    cache[:, :, p:p + new.shape[2]] = new
    cache[:, :, p + new.shape[2]] = 0


def adam_inputs(dtype):
    torch = _t()
    return lambda s: (_mk((1024, 1024), dtype, s), _mk((1024, 1024), dtype, s + 1),
                      _mk((1024, 1024), dtype, s + 2).mul_(0.1), _mk((1024, 1024), dtype, s + 3).pow_(2).mul_(0.01),
                      torch.tensor(float(s % 7 + 2)))


def adam_reference(p, g, m, v, step, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
    m.mul_(b1).add_(g, alpha=1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    t = float(step)
    mhat = m / (1 - b1 ** t)
    vhat = v / (1 - b2 ** t)
    p.sub_(lr * mhat / (vhat.sqrt() + eps))


def adam_fused(p, g, m, v, step, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):  # HONEST: fp32, folded step size
    t = float(step)
    m.lerp_(g, 1 - b1)
    v.mul_(b2).add_(g * g * (1 - b2))
    denom = (v.sqrt() / math.sqrt(1 - b2 ** t)).add_(eps)
    p.addcdiv_(m, denom, value=-lr / (1 - b1 ** t))


def adam_eps_inside(p, g, m, v, step, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):  # WRONG: eps inside the sqrt
    t = float(step)
    m.lerp_(g, 1 - b1)
    v.mul_(b2).add_(g * g * (1 - b2))
    p.sub_(lr * (m / (1 - b1 ** t)) / (v / (1 - b2 ** t) + eps).sqrt())


# ---------------------------------------------------------------- memory and aliasing


def gelu_writes_input(x):                       # WRONG: computes in place in its (undeclared) input
    torch = _t()
    return x.copy_(torch.nn.functional.gelu(x))


def gelu(x):
    return _t().nn.functional.gelu(x)


def gelu_out(x, out):
    out.copy_(_t().nn.functional.gelu(x))


def gelu_out_accumulates(x, out):               # WRONG: adds into its output buffer (reads it uninitialised)
    out += _t().nn.functional.gelu(x)


def row_slice(x):                               # the op: the first half of every row, as a new tensor
    return x[:, : x.shape[1] // 2].clone()


def row_slice_view(x):                          # WRONG: returns a view of its input (aliases it)
    return x[:, : x.shape[1] // 2]


def row_sums_empty_acc(x):                      # WRONG: accumulates into torch.empty
    acc = _t().empty(x.shape[0], dtype=x.dtype)
    for c in x.split(1024, -1):
        acc += c.sum(-1)
    return acc


def row_sums(x):
    return x.sum(-1)


# ---------------------------------------------------------------- cancellation, degenerate shapes, integers


def cancel_inputs(s):                           # (x + y) - x with y 1e-4 of x: the output is all cancellation
    return _mk((64, 4096), "float32", s), _mk((64, 4096), "float32", s + 1).mul_(1e-4)


def add_sub(x, y):
    return (x + y) - x


def centre(x):                                  # x - mean(x) on rows near a constant: cancels to ~1e-3
    return x - x.mean(-1, keepdim=True)


def centre_inputs(s):
    return (_mk((64, 4096), "float32", s).mul_(1e-3).add_(1.0),)


def centre_two_pass(x):                         # HONEST: the mean from fp32 blocks
    mu = sum(c.sum(-1, keepdim=True) for c in x.split(512, -1)) / x.shape[-1]
    return x - mu


def argmax_rows(x):
    return x.argmax(-1)


def argmax_by_max(x):                           # HONEST: first index equal to the row max
    torch = _t()
    hit = x == x.amax(-1, keepdim=True)
    idx = torch.arange(x.shape[-1]).expand_as(x)
    return torch.where(hit, idx, x.shape[-1]).amin(-1)


def tie_inputs(dtype):
    return lambda s: (_mk((64, 4096), "int64", s, low=0, high=50).to(getattr(_t(), dtype)),)


def topk_idx(x):
    return _t().topk(x, 8, -1).indices


def topk_stable(x):                             # HONEST: a stable sort, lowest index first among ties
    return _t().sort(x, dim=-1, descending=True, stable=True).indices[:, :8]


def topk_vals_idx(x):
    r = _t().topk(x, 8, -1)
    return r.values, r.indices


def topk_vals_idx_stable(x):
    r = _t().sort(x, dim=-1, descending=True, stable=True)
    return r.values[:, :8], r.indices[:, :8]


def topk_idx_stable_ref(x):                     # the reference states its tie-break: lowest index first
    return _t().sort(x, dim=-1, descending=True, stable=True).indices[:, :8]


def topk_by_masking(x):                         # HONEST: 8 rounds of argmax (first index), each winner masked
    torch = _t()
    work = x.clone()
    picks = []
    for _ in range(8):
        i = argmax_by_max(work)
        picks.append(i)
        work.scatter_(-1, i[:, None], -math.inf)
    return torch.stack(picks, -1)


def heads_view(x):                              # the op is a view: split the last dim into 8 heads
    return x.view(x.shape[0], 8, -1)


def heads_reshape(x):                           # HONEST: returns a view too, as the reference does
    return x.reshape(x.shape[0], 8, x.shape[1] // 8)


def to_bf16(x):
    return x.to(_t().bfloat16)


def to_bf16_kernel(x):                          # HONEST: returns its input when it is bf16 already (as .to does)
    return x if x.dtype == _t().bfloat16 else x.to(_t().bfloat16)


def argmax_last(x):                             # WRONG: the last index among ties
    torch = _t()
    flipped = torch.flip(x, (-1,)).argmax(-1)
    return x.shape[-1] - 1 - flipped


def cases() -> list[Case]:
    """Every case of the corpus, honest ones first."""
    torch = _t()
    bf, f32 = "bfloat16", "float32"
    ce_f32 = dict(input_scales=(1e-3, 100.0))
    rope = dict(inout_args=(0,), scaled_args=(0,))
    adam = dict(inout_args=(0, 2, 3), scaled_args=(1,))
    honest = [
        Case("fp32 gemm K=4096, split-K 8 fp32 partials", True, split_k(8), gemm, gemm_inputs(f32)),
        Case("fp32 gemm K=4096, blocks of 128 added in reverse", True, reversed_blocks, gemm, gemm_inputs(f32)),
        Case("bf16 gemm K=4096, fp32 accumulation", True, fp32_accumulate, gemm, gemm_inputs(bf)),
        Case("bf16 gemm K=4096, split-K 4 fp32 partials", True, split_k(4), gemm, gemm_inputs(bf)),
        Case("fp32 gemm N=1 (matrix-vector)", True, gemm_n1, gemm, gemm_inputs(f32, n=1)),
        Case("fp32 gemm M=1 (one row)", True, split_k(4), gemm, gemm_inputs(f32, m=1)),
        Case("fp32 gemm M=0 (empty batch)", True, split_k(4), gemm, gemm_inputs(f32, m=0)),
        Case("fp32 bias+GELU fused (erf written out)", True, fused_bias_gelu, bias_gelu, gemm_bias_inputs(f32)),
        Case("fp32 bias+GELU fused, O(1) pre-activations", True, fused_bias_gelu, bias_gelu,
             gemm_bias_inputs(f32, scaled=True)),
        Case("bf16 bias+GELU fused, fp32 math", True, fused_bias_gelu, bias_gelu, gemm_bias_inputs(bf)),
        Case("bf16 linear, GEMM then bias add (two roundings)", True, gemm_then_bias, linear,
             gemm_bias_inputs(bf, m=1024)),
        Case("fp32 row sums of 4096, blocked, reverse order", True, row_sums_blocked, row_sums, row_inputs(f32)),
        Case("bf16 RMSNorm, empty batch", True, rmsnorm_fp32(), rmsnorm, rms_inputs(bf, rows=0)),
        Case("fp32 softmax over a dimension of 1", True, online_softmax, softmax, row_inputs(f32, d=1)),
        Case("fp32 RMSNorm, 16 blocked partial sums", True, rmsnorm_blocked, rmsnorm, rms_inputs(f32)),
        Case("bf16 RMSNorm, fp32 math", True, rmsnorm_fp32(), rmsnorm, rms_inputs(bf)),
        Case("bf16 RMSNorm, one row of 4096", True, rmsnorm_fp32(), rmsnorm, rms_inputs(bf, rows=1)),
        Case("bf16 add+RMSNorm fused", True, add_rmsnorm_fused, add_rmsnorm, add_rms_inputs(bf)),
        Case("bf16 add+RMSNorm on the rounded residual", True, add_rmsnorm_from_rounded, add_rmsnorm,
             add_rms_inputs(bf)),
        Case("fp32 variance, Welford vs two-pass", True, welford, variance, row_inputs(f32)),
        Case("bf16 variance, Welford in fp32", True, welford, variance, row_inputs(bf)),
        Case("fp32 LayerNorm, Welford statistics", True, layernorm_welford, layernorm, rms_inputs(f32)),
        Case("bf16 LayerNorm op by op in bf16", True, layernorm_bf16_steps, layernorm, rms_inputs(bf),
             dict(input_scales=(1e3, "mixed"))),
        Case("fp32 online softmax", True, online_softmax, softmax, row_inputs(f32)),
        Case("bf16 online softmax", True, online_softmax, softmax, row_inputs(bf)),
        Case("fp32 logsumexp, blocked", True, logsumexp_blocked, logsumexp, row_inputs(f32)),
        Case("fp32 cross entropy fwd+bwd fused", True, cross_entropy_fused, cross_entropy_fwd_bwd, ce_inputs(f32),
             ce_f32),
        Case("bf16 cross entropy fwd+bwd fused", True, cross_entropy_fused, cross_entropy_fwd_bwd, ce_inputs(bf),
             ce_f32),
        Case("bf16 RoPE in place (declared)", True, rope_inplace, rope_reference, rope_inputs(bf), rope),
        Case("fp32 RoPE in place (declared)", True, rope_inplace, rope_reference, rope_inputs(f32), rope),
        Case("bf16 KV-cache append, position by position", True, kv_append_loop, kv_append, kv_inputs(bf),
             dict(inout_args=(0,))),
        Case("fp32 fused Adam step (declared)", True, adam_fused, adam_reference, adam_inputs(f32), adam),
        Case("fp32 (x + y) - x, cancels to 1e-4", True, add_sub, add_sub, cancel_inputs),
        Case("fp32 centring of near-constant rows", True, centre_two_pass, centre, centre_inputs),
        Case("argmax with ties (first index)", True, argmax_by_max, argmax_rows, tie_inputs(f32)),
        Case("top-8 indices with ties, stable sort", True, topk_stable, topk_idx, tie_inputs(f32)),
        Case("top-8 values+indices with ties, stable sort", True, topk_vals_idx_stable, topk_vals_idx,
             tie_inputs(f32)),
        Case("top-8 indices with ties, reference breaks ties stably", True, topk_by_masking, topk_idx_stable_ref,
             tie_inputs(f32)),
        Case("view op (split into heads) returning a view, as its reference", True, heads_reshape, heads_view,
             row_inputs(f32)),
        Case("bf16 cast returning its bf16 input", True, to_bf16_kernel, to_bf16, row_inputs(bf)),
        Case("fp32 GELU into a declared out buffer", True, gelu_out, gelu_out, row_inputs_out(f32),
             dict(out_args=(1,))),
    ]
    wrong = [
        Case("fp32 gemm x1.005 on 4 of 64 rows", False, rows_scaled([3, 17, 40, 63], 1.005), gemm,
             gemm_inputs(f32)),
        Case("fp32 gemm x1.001 on 4 of 64 columns", False, cols_scaled([0, 1, 2, 3], 1.001), gemm, gemm_inputs(f32)),
        Case("fp32 gemm x1.001 everywhere", False, rows_scaled(slice(None), 1.001), gemm, gemm_inputs(f32)),
        Case("bf16 gemm x1.01 on 4 of 64 rows", False, rows_scaled([3, 17, 40, 63], 1.01), gemm, gemm_inputs(bf)),
        Case("bf16 gemm x1.02 on 4 of 64 rows", False, rows_scaled([3, 17, 40, 63], 1.02), gemm, gemm_inputs(bf)),
        Case("bf16 gemm x1.01 on 4 of 64 columns", False, cols_scaled([0, 1, 2, 3], 1.01), gemm, gemm_inputs(bf)),
        Case("bf16 gemm x1.005 on 4 of 64 rows", False, rows_scaled([3, 17, 40, 63], 1.005), gemm, gemm_inputs(bf)),
        Case("bf16 GEMM then bias, x1.01 on 4 of 128 columns", False, gemm_then_bias_cols_scaled, linear,
             gemm_bias_inputs(bf, m=1024)),
        Case("fp32 gemm, bf16 weights", False, bf16_weights, gemm, gemm_inputs(f32)),
        Case("fp32 gemm, fp16-rounded operands", False, tf32_like, gemm, gemm_inputs(f32), expect="precision_downgrade"),
        Case("fp32 gemm, split-K 8 partials rounded to bf16", False, split_k(8, torch.bfloat16), gemm,
             gemm_inputs(f32)),
        Case("bf16 gemm, 4 split-K partials rounded to bf16", False, split_k(4, torch.bfloat16), gemm,
             gemm_inputs(bf)),
        Case("fp32 bias+GELU, tanh for erf", False, tanh_gelu, bias_gelu, gemm_bias_inputs(f32)),
        Case("fp32 bias+GELU, tanh for erf, O(1) pre-activations", False, tanh_gelu, bias_gelu,
             gemm_bias_inputs(f32, scaled=True)),
        Case("bf16 bias+GELU, tanh for erf", False, tanh_gelu, bias_gelu, gemm_bias_inputs(bf)),
        Case("fp32 bias+GELU, bias dropped on 16 columns", False, bias_dropped_on_block, bias_gelu,
             gemm_bias_inputs(f32)),
        Case("fp32 bias+GELU, pre-activation rounded to bf16", False, bias_gelu_bf16_intermediate, bias_gelu,
             gemm_bias_inputs(f32)),
        Case("fp32 gemm, weight cached by shape", False, cached_weights, gemm, gemm_inputs(f32)),
        Case("shape-specialised gemm (wrong for other M)", False, shape_specialised, gemm, gemm_inputs(f32)),
        Case("fp32 gemm memoised by shape", False, memoised_by_shape, gemm, gemm_inputs(f32)),
        Case("fp32 gemm, rows 16-31 one term short of K", False, gemm_rows_miss_last_k, gemm, gemm_inputs(f32)),
        Case("fp32 RMSNorm, weight read as bf16", False, rmsnorm_bf16_weight, rmsnorm, rms_inputs(f32)),
        Case("fp32 weighted row sums of positives, weights read as bf16", False, weighted_row_sums_bf16_weight,
             weighted_row_sums, positive_rms_inputs),
        Case("bf16 cross entropy without max subtraction (logits up to x100)", False, cross_entropy_no_max,
             cross_entropy_fwd_bwd, ce_inputs(bf), ce_f32),
        Case("fp32 RMSNorm eps 1e-5 for 1e-6", False, rmsnorm_fp32(1e-5), rmsnorm, rms_inputs(f32)),
        Case("bf16 RMSNorm eps 1e-4 for 1e-6", False, rmsnorm_fp32(1e-4), rmsnorm, rms_inputs(bf)),
        Case("fp32 RMSNorm off by one on rows 32-47", False, rmsnorm_off_by_one, rmsnorm, rms_inputs(f32)),
        Case("fp32 RMSNorm, rsqrt rounded to bf16", False, rmsnorm_rsqrt_bf16, rmsnorm, rms_inputs(f32)),
        Case("fp32 LayerNorm eps 1e-6 for 1e-5", False, layernorm_eps(1e-6), layernorm, rms_inputs(f32)),
        Case("fp32 variance divided by d - 1", False, unbiased_variance, variance, row_inputs(f32)),
        Case("fp32 softmax without max subtraction", False, softmax_no_max, softmax, row_inputs(f32)),
        Case("bf16 softmax without max subtraction", False, softmax_no_max, softmax, row_inputs(bf)),
        Case("fp32 logsumexp without max", False, logsumexp_no_max, logsumexp, row_inputs(f32)),
        Case("bf16 cross entropy, gradient x1.005 off target", False, cross_entropy_grad_scaled,
             cross_entropy_fwd_bwd, ce_inputs(bf), ce_f32),
        Case("bf16 RoPE, positions 128.. one off", False, rope_position_off, rope_reference, rope_inputs(bf), rope),
        Case("bf16 RoPE in place, undeclared", False, rope_inplace, rope_reference, rope_inputs(bf),
             dict(scaled_args=(0,)), expect="input_mutated"),
        Case("bf16 KV-cache append clobbering the next slot", False, kv_append_clobbers, kv_append, kv_inputs(bf),
             dict(inout_args=(0,))),
        Case("fp32 Adam, eps inside the sqrt", False, adam_eps_inside, adam_reference, adam_inputs(f32), adam),
        Case("fp32 GELU in its undeclared input", False, gelu_writes_input, gelu, row_inputs(f32),
             expect="input_mutated"),
        Case("fp32 GELU adding into its out buffer", False, gelu_out_accumulates, gelu_out, row_inputs_out(f32),
             dict(out_args=(1,))),
        Case("fp32 row sums accumulated in torch.empty", False, row_sums_empty_acc, row_sums, row_inputs(f32)),
        Case("fp32 row slice returned as a view of its input", False, row_slice_view, row_slice, row_inputs(f32)),
        Case("argmax, last index among ties", False, argmax_last, argmax_rows, tie_inputs(f32)),
    ]
    return honest + wrong


def row_inputs_out(dtype):
    return lambda s: (_mk((R, D), dtype, s), _t().zeros(R, D, dtype=getattr(_t(), dtype)))


def run_case(case: Case) -> dict[str, Any]:
    """Check one case; its verdict (``pass`` or the failure's reason), the message's first line, seconds."""
    from pytest_ditgate import GateFailure, check_kernel

    _WEIGHTS.clear()
    _MEMO.clear()
    start = time.perf_counter()
    try:
        report = check_kernel(case.candidate, case.reference, case.make_inputs, label=case.name, **case.options)
        verdict, detail = "pass", report.summary().splitlines()[0][:300]
    except GateFailure as failure:
        verdict, detail = failure.reason, str(failure).splitlines()[0][:300]
    except Exception as error:  # noqa: BLE001 - a crash of the gate itself is a finding, recorded
        verdict, detail = f"error:{type(error).__name__}", str(error).splitlines()[0][:300] if str(error) else ""
    seconds = time.perf_counter() - start
    if case.honest:
        ok = verdict == "pass"
    else:
        ok = verdict not in ("pass",) and not verdict.startswith("error") and (
            case.expect is None or verdict == case.expect)
    return {"case": case.name, "honest": case.honest, "verdict": verdict, "ok": ok,
            "limit": LIMITS.get(case.name) if not ok else None, "detail": detail, "seconds": round(seconds, 2)}


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The summary table: honest passed / total, wrong caught / total, each miss named."""
    honest = [r for r in rows if r["honest"]]
    wrong = [r for r in rows if not r["honest"]]
    lines = ["| kind | ok / total | misses (verdict) |", "|---|---|---|"]
    for label, group in (("honest passed", honest), ("wrong caught", wrong)):
        misses = [f"{r['case']} ({r['verdict']}{'; documented limit' if r['limit'] else ''})"
                  for r in group if not r["ok"]]
        lines.append(f"| {label} | {sum(r['ok'] for r in group)} / {len(group)} | {'; '.join(misses) or '-'} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="folder for kcheck_redteam_<arch>.json")
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    parser.add_argument("--cases", default="", help="comma-separated substrings of case names (default: all)")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    wanted = [w.strip() for w in args.cases.split(",") if w.strip()]
    start = time.perf_counter()
    rows = []
    for case in cases():
        if wanted and not any(w in case.name for w in wanted):
            continue
        row = run_case(case)
        rows.append(row)
        harness.log(f"{'honest' if row['honest'] else 'wrong '} {'ok  ' if row['ok'] else 'MISS'} "
                    f"{row['verdict']:>20} {row['seconds']:6.2f}s  {row['case']}")
    lines = table(rows)
    regressions = [r["case"] for r in rows if not r["ok"] and not r["limit"]]
    record = {"benchmark": "kcheck_redteam", "command": " ".join(["python", *sys.argv]),
              "threads": torch.get_num_threads(), "timer": TIMER, "seconds": round(time.perf_counter() - start, 1),
              "torch": torch.__version__, "table": lines, "regressions": regressions, "cases": rows,
              "environment": harness.environment()}
    harness.write_record(args.out, "kcheck_redteam", record)
    for row in rows:
        if not row["ok"]:
            print(f"miss: {row['case']}: {row['verdict']}: {row['detail']}"
                  + (f" [documented limit: {row['limit']}]" if row["limit"] else ""))
    print("\n".join(lines))
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
