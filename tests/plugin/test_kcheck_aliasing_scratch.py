"""An output that shares memory with a ``scratch_args`` workspace fails ``aliased_output``.

Scratch holds unspecified contents on entry to every call, so a kernel that computes its result into its
workspace and returns the workspace (or a slice or a reshape of it) hands the caller a "result" its next call
overwrites: ``ws.copy_(softmax(x)); return ws`` passed every value check, and ``aliased_output`` exempted
scratch along with the out and in-out arguments. It fails now whatever the reference returns (a reference that
returns its scratch has declared the wrong role). Kernels that work in their scratch and return a new tensor,
return their declared out buffer or in-out argument, or return an out buffer that shares one buffer with their
scratch (two halves of it, no element shared) pass, as before.
"""

from __future__ import annotations

import pytest

from kcheck_suites import run_suite

SCRATCH = '''
import torch
from pytest_ditgate.correctness.inputs import make_tensor


def softmax_ref(x, ws):
    return torch.softmax(x, -1)


def returns_workspace(x, ws):               # WRONG: its workspace is the "result"
    ws.copy_(torch.softmax(x, -1))
    return ws


def returns_workspace_slice(x, ws):         # WRONG: a slice of a larger workspace
    ws[: x.shape[0]].copy_(torch.softmax(x, -1))
    return ws[: x.shape[0]]


def returns_workspace_reshaped(x, ws):      # WRONG: a flat workspace, reshaped
    ws[: x.numel()].copy_(torch.softmax(x, -1).reshape(-1))
    return ws[: x.numel()].view(x.shape)


def workspace_then_copy(x, ws):             # HONEST: works in its workspace, returns a new tensor
    ws.copy_(x).sub_(x.amax(-1, keepdim=True)).exp_()
    return ws / ws.sum(-1, keepdim=True)


def softmax_out(x, out, ws):                # HONEST: returns its declared out buffer
    ws.copy_(torch.softmax(x, -1))
    out.copy_(ws)
    return out


def softmax_out_ref(x, out, ws):
    return torch.softmax(x, -1)


def softmax_inplace(x, ws):                 # HONEST: returns its declared in-out argument
    ws.copy_(torch.softmax(x, -1))
    return x.copy_(ws)


def rows(seed):
    return make_tensor((64, 1024), "float32", seed=seed), torch.empty(64, 1024)


def test_returns_workspace(kernel_check):
    kernel_check(returns_workspace, softmax_ref, rows, scratch_args=(1,))


def test_returns_workspace_against_itself(kernel_check):
    kernel_check(returns_workspace, returns_workspace, rows, scratch_args=(1,), label="workspace_self")


def test_returns_workspace_slice(kernel_check):
    kernel_check(returns_workspace_slice, softmax_ref,
                 lambda s: (make_tensor((64, 1024), "float32", seed=s), torch.empty(128, 1024)), scratch_args=(1,))


def test_returns_workspace_reshaped(kernel_check):
    kernel_check(returns_workspace_reshaped, softmax_ref,
                 lambda s: (make_tensor((64, 1024), "float32", seed=s), torch.empty(2 * 64 * 1024)), scratch_args=(1,))


def test_honest_workspace_then_copy(kernel_check):
    kernel_check(workspace_then_copy, softmax_ref, rows, scratch_args=(1,), seed=3)


def test_honest_out_buffer_beside_scratch(kernel_check):
    def make(seed):                         # the out buffer and the workspace: two halves of one buffer
        buffer = torch.empty(128, 1024)
        return make_tensor((64, 1024), "float32", seed=seed), buffer[:64], buffer[64:]
    kernel_check(softmax_out, softmax_out_ref, make, out_args=(1,), scratch_args=(2,), seed=11)


def test_honest_inout_returned(kernel_check):
    kernel_check(softmax_inplace, softmax_inplace, rows, inout_args=(0,), scratch_args=(1,))
'''


def test_an_output_sharing_a_scratch_argument_fails_and_declared_outputs_pass(pytester: pytest.Pytester) -> None:
    out = run_suite(pytester, SCRATCH, passed=3, failed={
        "returns_workspace": "aliased_output", "workspace_self": "aliased_output",
        "returns_workspace_slice": "aliased_output", "returns_workspace_reshaped": "aliased_output"})
    assert "out is a view of the candidate's scratch argument arg1" in out
    assert "declared in scratch_args: a workspace whose contents are unspecified on entry to every call" in out
    assert "out_args=(...) (written, then compared as the output)" in out


def test_the_scratch_message_names_the_output_and_the_workspace() -> None:
    from pytest_ditgate.correctness import aliasing

    headline, details = aliasing.scratch_returned("out[1]", "ws")
    assert headline == "out[1] is a view of the candidate's scratch argument ws (first call)"
    assert "overwrites out[1] after it was returned" in details[0]
