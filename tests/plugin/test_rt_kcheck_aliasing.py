"""Outputs that are views of a read-only input fail ``aliased_output``; views the reference returns too pass.

A kernel that returns a slice of its input (or the input itself) has the right values, so every value check
passed it; yet the caller's next write into the input changes the output. Honest kernels whose reference is a
view op (a reshape), a cast that returns its input when the dtype already matches (as ``.to`` does), a kernel
returning its declared out buffer or its in-place argument, and out buffers that share a buffer with an input
pass.
"""

from __future__ import annotations

import pytest

from kcheck_suites import run_suite

ALIASES = '''
import torch
from pytest_ditgate.correctness.inputs import make_tensor


def first_half(x):                          # the op: the first half of every row, as a new tensor
    return x[:, : x.shape[1] // 2].clone()


def half_view(x):                           # WRONG: a view of its input
    return x[:, : x.shape[1] // 2]


def relu_ref(x):
    return torch.relu(x)


def relu_or_identity(x):                    # WRONG: returns its input itself where nothing is negative
    return x if bool((x >= 0).all()) else torch.relu(x)


def rows(dtype="float32"):
    return lambda seed: (make_tensor((64, 4096), dtype, seed=seed),)


def positive_rows(seed):
    return (make_tensor((64, 4096), "float32", seed=seed, low=0.5, high=2.0),)


def test_slice_view(kernel_check):
    kernel_check(half_view, first_half, rows())


def test_identity_for_positive_inputs(kernel_check):
    kernel_check(relu_or_identity, relu_ref, positive_rows)


def heads(x):                               # a view op: its reference returns a view
    return x.view(x.shape[0], 8, -1)


def heads_reshape(x):                       # HONEST: a view, as the reference
    return x.reshape(x.shape[0], 8, x.shape[1] // 8)


def to_bf16(x):
    return x.to(torch.bfloat16)


def to_bf16_kernel(x):                      # HONEST: its input when already bf16, as .to does
    return x if x.dtype == torch.bfloat16 else x.to(torch.bfloat16)


def gelu_out(x, out):                       # HONEST: writes and returns its declared out buffer
    out.copy_(torch.nn.functional.gelu(x))
    return out


def scale_inplace(x):                       # HONEST: updates its declared in-out argument, returns it
    return x.mul_(2)


def test_honest_view_op(kernel_check):
    kernel_check(heads_reshape, heads, rows())


def test_honest_cast_returning_its_input(kernel_check):
    kernel_check(to_bf16_kernel, to_bf16, rows("bfloat16"))


def test_honest_out_buffer_returned(kernel_check):
    kernel_check(gelu_out, gelu_out, lambda s: (make_tensor((64, 4096), seed=s), torch.zeros(64, 4096)),
                 out_args=(1,))


def test_honest_out_buffer_sharing_the_input_buffer(kernel_check):
    def make(seed):                         # the input and the out buffer are two halves of one buffer
        buffer = make_tensor((128, 4096), seed=seed)
        return buffer[:64], buffer[64:]
    kernel_check(gelu_out, gelu_out, make, out_args=(1,))


def test_honest_inplace_returned(kernel_check):
    kernel_check(scale_inplace, scale_inplace, rows(), inout_args=(0,))
'''


def test_views_of_read_only_inputs_fail_and_views_the_reference_returns_pass(pytester: pytest.Pytester) -> None:
    out = run_suite(pytester, ALIASES, passed=5,
                    failed={"half_view": "aliased_output", "relu_or_identity": "aliased_output"})
    assert "out is a view of the candidate's read-only input arg0" in out
    assert "return a copy (.clone())" in out


def test_the_reason_is_a_stable_code() -> None:
    from pytest_ditgate.correctness.report import REASONS

    assert "aliased_output" in REASONS
