"""GPU gate tests for check_kernel: the CUDA-only cheats (side-stream race, stale ``torch.empty``
memory) are caught, every other reason code fires on CUDA tensors too, and honest bf16/fp16 kernels
pass over many seeds. Run with ``pytest --ditgate tests/gates/test_correctness_gpu.py -v -rs``.
"""

from __future__ import annotations

import functools

import pytest

from pytest_ditgate import GateFailure, check_kernel
from pytest_ditgate.correctness.inputs import make_tensor

pytestmark = pytest.mark.requires_gpu(why="CUDA tensors and streams")

SLEEP_CYCLES = 200_000_000  # ~0.1 s on a ~2 GHz SM clock: the side-stream kernel is still running


def _cuda_inputs(dtype="bfloat16", *shapes):
    shapes = shapes or ((64, 257),)

    def make(seed):
        return tuple(make_tensor(shape, dtype, seed=seed * 17 + i, device="cuda") for i, shape in enumerate(shapes))
    return make


def _reason(excinfo) -> str:
    return excinfo.value.reason


# -- CUDA-only cheats -------------------------------------------------------------------------------

def test_side_stream_race_is_caught_as_stale_output() -> None:
    import torch

    side = torch.cuda.Stream()

    def racing(x):
        out = torch.empty_like(x)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(SLEEP_CYCLES)
            torch.mul(x, 2, out=out)
        return out  # the caller's stream is never made to wait for `side`

    with pytest.raises(GateFailure) as excinfo:
        check_kernel(racing, lambda x: x * 2, _cuda_inputs())
    assert _reason(excinfo) == "stale_output"
    assert "work was left running on another stream" in excinfo.value.message


def test_side_stream_work_ordered_back_to_the_caller_passes() -> None:
    import torch

    side = torch.cuda.Stream()

    def ordered(x):
        out = torch.empty_like(x)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(SLEEP_CYCLES // 10)
            torch.mul(x, 2, out=out)
        torch.cuda.current_stream().wait_stream(side)
        out.record_stream(torch.cuda.current_stream())
        return out

    assert check_kernel(ordered, lambda x: x * 2, _cuda_inputs(), trials=3).passed


def test_unwritten_torch_empty_output_is_caught_as_stale_output() -> None:
    import torch

    def lazy(x):  # hopes torch.empty hands back a block still holding the right answer
        return torch.empty_like(x)

    with pytest.raises(GateFailure) as excinfo:
        check_kernel(lazy, lambda x: x * 2, _cuda_inputs())
    assert _reason(excinfo) == "stale_output"


def test_partially_written_output_is_caught_as_stale_output() -> None:
    import torch

    def tail_forgotten(x):  # a grid that misses the last partial block
        out = torch.empty_like(x)
        out[:, :256] = x[:, :256] * 2
        return out

    with pytest.raises(GateFailure) as excinfo:
        check_kernel(tail_forgotten, lambda x: x * 2, _cuda_inputs())
    assert _reason(excinfo) == "stale_output"
    assert "64 of 16448 elements" in excinfo.value.message


def test_reference_result_left_in_the_caching_allocator_does_not_pass() -> None:
    """The classic cheat: run after the reference and return its freed output via torch.empty."""
    import torch

    def reuse_reference_block(x):
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)

    with pytest.raises(GateFailure) as excinfo:
        check_kernel(reuse_reference_block, lambda x: x.float().exp().to(x.dtype), _cuda_inputs(), trials=3)
    assert _reason(excinfo) == "stale_output"


# -- every other reason code on CUDA tensors ---------------------------------------------------------

def _cheats():
    import torch

    calls = []
    cache = {}

    def nondeterministic(x):
        calls.append(1)
        return x.float() * 2 + (len(calls) % 2) * 1e-6

    def constant(x):
        cache.setdefault("out", x * 2)
        return cache["out"].clone()

    def nan_one(x):
        out = x * 2
        out[3, 7] = float("nan")
        return out

    def mutating(x):
        return x.mul_(2)

    def crash(x):
        raise RuntimeError("CUDA error: an illegal memory access was encountered (planted)")

    def tampering(x):
        torch.cuda.Event.elapsed_time = lambda self, end: 1e-6  # restored by the test
        return x * 2

    return {
        "mismatch": (lambda x: x * 2.05, None),
        "zeros": (lambda x: torch.zeros_like(x), None),
        "nonfinite": (nan_one, None),
        "shape": (lambda x: (x * 2)[:, :-1], None),
        "dtype": (lambda x: x.float() * 2, None),
        "input_mutated": (mutating, None),
        "nondeterministic": (nondeterministic, "float32"),
        "constant_output": (constant, None),
        "crash": (crash, None),
        "timer_tampered": (tampering, None),
    }


EXPECTED = {"mismatch": "mismatch", "zeros": "mismatch", "nonfinite": "nonfinite", "shape": "shape",
            "dtype": "dtype", "input_mutated": "input_mutated", "nondeterministic": "nondeterministic",
            "constant_output": "constant_output", "crash": "crash", "timer_tampered": "timer_tampered"}


@pytest.mark.parametrize("cheat", list(EXPECTED))
def test_each_reason_code_fires_on_cuda(cheat: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda.Event, "elapsed_time", torch.cuda.Event.elapsed_time)  # undo any tampering
    kernel, dtype = _cheats()[cheat]
    with pytest.raises(GateFailure) as excinfo:
        check_kernel(kernel, lambda x: x * 2, _cuda_inputs(dtype or "bfloat16"))
    assert _reason(excinfo) == EXPECTED[cheat], excinfo.value.message
    assert "on cuda:0" in excinfo.value.message


def test_wrapped_synchronize_is_timer_tampering(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    real = torch.cuda.synchronize
    monkeypatch.setattr(torch.cuda, "synchronize", functools.wraps(real)(lambda device=None: None))
    with pytest.raises(GateFailure) as excinfo:
        check_kernel(lambda x: x * 2, lambda x: x * 2, _cuda_inputs())
    assert _reason(excinfo) == "timer_tampered" and "torch.cuda.synchronize" in excinfo.value.message


# -- honest kernels pass over many seeds --------------------------------------------------------------

def _honest():
    import torch
    import torch.nn.functional as F

    return {
        "bf16 matmul (cuBLAS, fp32 accumulate)": (
            lambda a, b: a @ b, "bfloat16", ((96, 320), (320, 72))),
        "fp16 matmul, transposed operand": (
            lambda a, b: a @ b.t(), "float16", ((64, 256), (80, 256))),
        "bf16 layernorm + adaLN modulate, fp32 math": (
            lambda x, s, t: (F.layer_norm(x.float(), x.shape[-1:]) * (1 + s.float()) + t.float()).to(x.dtype),
            "bfloat16", ((33, 1152), (1152,), (1152,))),
        # every op rounded to bf16, intermediates up to ~16 where one bf16 ulp is 0.0625: the default atol
        # (half an ulp at 4) is too strict for that on purpose; such a kernel states its allowance
        "bf16 layernorm + adaLN modulate, every op in bf16": (
            lambda x, s, t: F.layer_norm(x, x.shape[-1:]) * (1 + s) + t, "bfloat16",
            ((33, 1152), (1152,), (1152,)), {"atol": 0.125}),
        "fp16 gelu(tanh) in fp16": (
            lambda x, w, b: F.gelu(x * w + b, approximate="tanh"), "float16", ((17, 301), (301,), (301,))),
        "bf16 gated residual": (
            lambda x, g, y: x + g * y, "bfloat16", ((5, 257, 64), (64,), (5, 257, 64))),
        "bf16 softmax": (lambda x, w, b: torch.softmax(x * w, -1) + b, "bfloat16", ((8, 513), (513,), (513,))),
        "bf16 SDPA (flash/efficient backend)": (
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v), "bfloat16",
            ((2, 4, 128, 64), (2, 4, 128, 64), (2, 4, 128, 64))),
    }


@pytest.mark.requires_gpu(bf16=True, why="bf16 kernels")
@pytest.mark.parametrize("name", ["bf16 matmul (cuBLAS, fp32 accumulate)", "fp16 matmul, transposed operand",
                                  "bf16 layernorm + adaLN modulate, fp32 math",
                                  "bf16 layernorm + adaLN modulate, every op in bf16", "fp16 gelu(tanh) in fp16",
                                  "bf16 gated residual", "bf16 softmax", "bf16 SDPA (flash/efficient backend)"])
def test_honest_low_precision_cuda_kernels_pass_over_50_seeds(name: str) -> None:
    kernel, dtype, shapes, *overrides = _honest()[name]
    allowance = overrides[0] if overrides else {}
    report = check_kernel(kernel, kernel, _cuda_inputs(dtype, *shapes), trials=50, **allowance)
    assert report.passed and len(report.seeds) == 50
    print(f"\n{report.summary()}")


def test_kernel_check_fixture_records_on_cuda(kernel_check, request: pytest.FixtureRequest) -> None:
    from pytest_ditgate.correctness.plugin import kernel_checks_key

    kernel_check(lambda x: x * 2, lambda x: x * 2, _cuda_inputs(), label="double")
    with pytest.raises(GateFailure):
        kernel_check(lambda x: x * 3, lambda x: x * 2, _cuda_inputs(), label="triple")
    assert request.node.stash[kernel_checks_key] == [("double", True, None), ("triple", False, "mismatch")]
