"""Inputs that are views of larger buffers: the precision probe calls the candidate on copies in the inputs' own
layouts (strides and storage offset), and a write into an input's buffer outside its view fails
``input_mutated``.

A kernel that reads its fp32 input as bf16 only on its strided path fails ``precision_downgrade``, and one that
checks its layout passes (the probe used to call both on contiguous copies at offset 0). Writes before an offset
view, past a KV cache's end (the next slot), into the gaps of a strided view, and by an in-out argument outside its
view fail; honest kernels on the same views, and out buffers sharing a buffer with an input, pass.
"""

from __future__ import annotations

import pytest

from kcheck_suites import run_suite

PROBE_LAYOUTS = '''
import torch
from pytest_ditgate.correctness.inputs import make_tensor


def row_sums(x):
    return x.sum(-1)


def positives(layout):
    return lambda seed: (make_tensor((32, 32768), "float32", seed=seed, layout=layout, low=0.0, high=2.0),)


def bf16_read_when_strided(x):              # WRONG: reads its fp32 input as bf16 on its non-contiguous path
    return x.sum(-1) if x.is_contiguous() else x.bfloat16().float().sum(-1)


def bf16_read_at_an_offset(x):              # WRONG: the same where the input starts inside its buffer
    return x.sum(-1) if x.storage_offset() == 0 else x.bfloat16().float().sum(-1)


def interleaved_sum(x):                     # HONEST: a kernel for stride-2 views that checks its layout
    if x.stride(-1) != 2:
        raise ValueError(f"expects stride 2 in the last dim, got {x.stride()}")
    return x.sum(-1)


def offset_sum(x):                          # HONEST: a kernel for views one row into their buffer
    if x.storage_offset() != x.shape[-1] or x.stride() != (x.shape[-1], 1):
        raise ValueError(f"expects a view one row in, got offset {x.storage_offset()}, strides {x.stride()}")
    return x.sum(-1)


def transposed_gemm(a, b):                  # HONEST: needs a column-major first operand
    if a.stride(0) != 1:
        raise ValueError(f"expects a column-major a, got strides {a.stride()}")
    return a @ b


def test_downgrade_on_the_strided_path(kernel_check):
    kernel_check(bf16_read_when_strided, row_sums, positives("strided"))


def test_downgrade_at_an_offset(kernel_check):
    kernel_check(bf16_read_at_an_offset, row_sums, positives("offset"))


def test_honest_strided(kernel_check):
    report = kernel_check(interleaved_sum, row_sums, lambda s: (make_tensor((64, 4096), seed=s, layout="strided"),))
    assert report.precision.status == "responds", report.precision


def test_honest_offset(kernel_check):
    report = kernel_check(offset_sum, row_sums, lambda s: (make_tensor((64, 4096), seed=s, layout="offset"),))
    assert report.precision.status == "responds", report.precision


def test_honest_transposed_bf16(kernel_check):
    kernel_check(transposed_gemm, lambda a, b: a @ b, lambda s: (
        make_tensor((256, 1024), "bfloat16", seed=s, layout="transposed"), make_tensor((1024, 64), "bfloat16", seed=s + 1)))
'''


def test_the_probe_keeps_each_inputs_strides_and_offset(pytester: pytest.Pytester) -> None:
    out = run_suite(pytester, PROBE_LAYOUTS, passed=3, failed={"bf16_read_when_strided": "precision_downgrade",
                                                                "bf16_read_at_an_offset": "precision_downgrade"})
    assert "precision-probe call" not in out  # no honest kernel crashed on the probe's copies


OUT_OF_VIEW = '''
import torch
from pytest_ditgate.correctness.inputs import make_tensor


def clobbers_before_view(x):                # WRONG: zeroes the first element of x's buffer, before its view
    y = torch.tanh(x)
    torch.as_strided(x, (1,), (1,), 0).zero_()
    return y


def writes_into_the_gaps(x):                # WRONG: uses the gaps of its stride-2 view as a workspace
    y = torch.tanh(x)
    torch.as_strided(x, x.shape, x.stride(), x.storage_offset() + 1).copy_(y)
    return y


def kv_append(cache, new, position):
    cache[:, :, int(position):int(position) + new.shape[2]] = new


def kv_append_clobbers_next(cache, new, position):   # WRONG: also zeroes the slot after the cache view's end
    kv_append(cache, new, position)
    b, h, t, d = cache.shape
    torch.as_strided(cache, (b, h, 1, d), cache.stride(), cache.storage_offset() + t * cache.stride(2)).zero_()


def kv_append_dirty_on_second_call(cache, new, position, calls=[]):  # WRONG: clobbers only when called again
    calls.append(1)
    kv_append(cache, new, position)
    if len(calls) % 2 == 0:
        b, h, t, d = cache.shape
        torch.as_strided(cache, (b, h, 1, d), cache.stride(), cache.storage_offset() + t * cache.stride(2)).fill_(1)


def cache_inputs(dtype):                   # the cache: positions 0..63 of a 128-position buffer
    def make(seed):
        buffer = make_tensor((2, 4, 128, 16), dtype, seed=seed)
        return buffer[:, :, :64], make_tensor((2, 4, 3, 16), dtype, seed=seed + 1), torch.tensor(seed % 60)
    return make


def halves(seed):                          # an input and an out buffer: the two halves of one buffer's rows
    buffer = make_tensor((64, 8192), "float32", seed=seed)
    return buffer[:, :4096], buffer[:, 4096:]


def tanh_into(x, out):
    torch.tanh(x, out=out)


def test_write_before_an_offset_view(kernel_check):
    kernel_check(clobbers_before_view, torch.tanh, lambda s: (make_tensor((64, 64), seed=s, layout="offset"),))


def test_write_into_a_strided_views_gaps(kernel_check):
    kernel_check(writes_into_the_gaps, torch.tanh, lambda s: (make_tensor((64, 64), seed=s, layout="strided"),))


def test_kv_append_writes_past_the_view(kernel_check):
    kernel_check(kv_append_clobbers_next, kv_append, cache_inputs("bfloat16"), inout_args=(0,))


def test_kv_append_writes_past_the_view_on_its_second_call(kernel_check):
    kernel_check(kv_append_dirty_on_second_call, kv_append, cache_inputs("float32"), inout_args=(0,))


def test_honest_kv_append_into_a_view(kernel_check):
    for dtype in ("bfloat16", "float32"):
        kernel_check(kv_append, kv_append, cache_inputs(dtype), inout_args=(0,))


def test_honest_offset_and_strided_views(kernel_check):
    for layout in ("offset", "strided", "transposed"):
        kernel_check(lambda x: torch.tanh(x.float()).to(x.dtype), torch.tanh,
                     lambda s: (make_tensor((64, 4096), "bfloat16", seed=s, layout=layout),))


def test_honest_out_buffer_beside_its_input(kernel_check):
    kernel_check(tanh_into, lambda x, out: torch.tanh(x), halves, out_args=(1,))
'''


def test_a_write_outside_an_inputs_view_fails_input_mutated(pytester: pytest.Pytester) -> None:
    out = run_suite(pytester, OUT_OF_VIEW, passed=3, failed={
        kernel: "input_mutated" for kernel in ("clobbers_before_view", "writes_into_the_gaps", "kv_append_clobbers_next",
                                               "kv_append_dirty_on_second_call")})
    assert "the candidate wrote into the buffer of arg0 outside its view (first call)" in out
    assert "the candidate wrote into the buffer of arg0 outside its view (second call)" in out
    assert "bytes before arg0's first element" in out
    assert "between arg0's elements (in a gap of its strides" in out
    assert "no declaration allows it" in out
