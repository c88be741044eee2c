"""Gate suite for kernels/: every kernel, dtype and a wide shape range against the float64 reference.

GPU-only (``requires_gpu``); compiled for the visible GPU on first use (JIT cache). Each kernel also has
a test proving the gate rejects a wrong candidate.
"""

from __future__ import annotations

import pytest
# a plain import (a test dependency): importorskip would skip the whole gate, on a GPU too, without it
from hypothesis import HealthCheck, given, settings, strategies as st


DTYPE_NAMES = ("bf16", "fp16", "fp32")
#: hidden sizes of DiT-S/B/XL and others that hit every launcher path (tail packets, scalar, block kernel)
HIDDEN_SIZES = (384, 768, 1152, 1024, 72, 8, 1, 1000, 1153, 4096, 5000)


def torch_dtype(name: str):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]

pytestmark = pytest.mark.requires_gpu(cc=">=8.0", bf16=True, why="kernels/ targets Ampere and newer")

fixture_ok = settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
                      deadline=None)
hidden = st.one_of(st.sampled_from(HIDDEN_SIZES), st.integers(1, 2600))
batch = st.integers(1, 4)
tokens = st.integers(1, 70)


def _args(make, names):
    return lambda seed: tuple(make(seed)[n] for n in names)


#: op -> (reference name in kernels.reference, argument names in call order)
OPS = {
    "layernorm_modulate": ("layernorm_modulate_ref", ("x", "scale", "shift")),
    "gated_residual": ("gated_residual_ref", ("x", "gate", "y")),
    "gated_residual_layernorm_modulate": ("gated_residual_layernorm_modulate_ref", ("x", "gate", "y", "scale", "shift")),
}


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("dtype", DTYPE_NAMES)
@fixture_ok
@given(B=batch, N=tokens, H=hidden, strided=st.booleans())
def test_kernel_matches_reference(kernel_check, dit_inputs, op, dtype, B, N, H, strided) -> None:
    """Every kernel, every dtype, hypothesis shapes (any H: vector, scalar and block paths), strided rows."""
    import kernels
    from kernels import reference

    ref_name, names = OPS[op]
    make = dit_inputs(B, N, H, torch_dtype(dtype), strided_rows=strided)
    kernel_check(getattr(kernels, op), getattr(reference, ref_name), _args(make, names),
                 label=f"{op} {dtype} {B}x{N}x{H}{' strided' if strided else ''}")


@pytest.mark.parametrize("dtype", DTYPE_NAMES)
@pytest.mark.parametrize("shape", [(16, 256, 1152), (2, 4096, 1152), (4, 256, 384), (4, 256, 768)])
def test_dit_shapes(kernel_check, dit_inputs, dtype, shape) -> None:
    """The DiT-S/B/XL sizes the benchmarks time, each kernel once."""
    import kernels
    from kernels import reference as ref

    make = dit_inputs(*shape, torch_dtype(dtype))
    kernel_check(kernels.layernorm_modulate, ref.layernorm_modulate_ref, _args(make, ("x", "scale", "shift")),
                 trials=2)
    kernel_check(kernels.gated_residual, ref.gated_residual_ref, _args(make, ("x", "gate", "y")), trials=2)
    kernel_check(kernels.gated_residual_layernorm_modulate, ref.gated_residual_layernorm_modulate_ref,
                 _args(make, ("x", "gate", "y", "scale", "shift")), trials=2)


def test_gate_rejects_wrong_kernels(kernel_check, dit_inputs) -> None:
    """Bad candidates built from the real kernels must fail the gate (wrong eps, dropped gate, stale x_new)."""
    import torch

    import kernels
    from kernels import reference as ref
    from pytest_ditgate import GateFailure

    make = dit_inputs(2, 64, 1152, torch.bfloat16)
    wrong_eps = lambda x, s, h: kernels.layernorm_modulate(x, s, h, eps=10.0)  # noqa: E731
    no_gate = lambda x, g, y: kernels.gated_residual(x, torch.ones_like(g), y)  # noqa: E731
    stale = lambda x, g, y, s, h: (x, kernels.gated_residual_layernorm_modulate(x, g, y, s, h)[1])  # noqa: E731
    cases = [(wrong_eps, ref.layernorm_modulate_ref, ("x", "scale", "shift")),
             (no_gate, ref.gated_residual_ref, ("x", "gate", "y")),
             (stale, ref.gated_residual_layernorm_modulate_ref, ("x", "gate", "y", "scale", "shift"))]
    for candidate, reference, names in cases:
        with pytest.raises(GateFailure) as failure:
            kernel_check(candidate, reference, _args(make, names), trials=1)
        assert failure.value.reason == "mismatch"


def test_runs_in_a_cuda_graph_and_on_a_side_stream(dit_inputs) -> None:
    """Launches go to torch's current stream, so they are captured by CUDA graphs and ordered on streams."""
    import torch

    import kernels
    from kernels.reference import layernorm_modulate_ref

    t = dit_inputs(4, 128, 1152, torch.bfloat16)(0)
    expected = layernorm_modulate_ref(t["x"].double(), t["scale"].double(), t["shift"].double())
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = kernels.layernorm_modulate(t["x"], t["scale"], t["shift"])
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = kernels.layernorm_modulate(t["x"], t["scale"], t["shift"])
    torch.cuda.current_stream().wait_stream(side)
    captured.zero_()
    graph.replay()
    torch.cuda.synchronize()
    for result in (out, captured):
        assert (result.double() - expected).norm() / expected.norm() < 8e-3
