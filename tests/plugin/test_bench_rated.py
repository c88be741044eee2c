"""``rated``: a launch that no torch op makes (a DSL GEMM, a raw Triton kernel) carries its FLOPs and bytes to
the phase profile through a profiler range's name; outside a profiler it costs nothing and records nothing."""

from __future__ import annotations

import sys

import pytest

from pytest_ditgate.bench.profiling import summarize_trace
from pytest_ditgate.bench.rated import parse_range, range_name, rated
from pytest_ditgate.errors import DitgateUsageError

PEAKS = {"tflops": {"bf16": 800.0}, "gbps": 4000.0, "source": "test", "profile": "test"}
GEMM = "kernel_cutlass_kernel_quackgemm_default_epiGemmDefaultSm90"
COPY = "_copy_kernel"  # a raw Triton kernel's name


def _range(name: str, ts: float, dur: float) -> dict:
    """The device-side span of a profiler range (the profiler spans it over the kernels launched inside)."""
    return {"ph": "X", "cat": "gpu_user_annotation", "name": name, "tid": 7, "ts": ts, "dur": dur,
            "args": {"stream": 7}}


def _kernel(name: str, ts: float, dur: float, op: int | None = None) -> dict:
    args = {"stream": 7} if op is None else {"External id": op, "stream": 7}
    return {"ph": "X", "cat": "kernel", "name": name, "tid": 7, "ts": ts, "dur": dur, "args": args}


def _op(name: str, op: int) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "tid": 1, "ts": -5.0, "dur": 1.0, "args": {"External id": op}}


def test_the_range_name_carries_the_amounts_and_reads_back() -> None:
    name = range_name("quack qkv", flops=2 * 4096 * 1152 * 3456, dtype="bf16")
    assert name == "ditgate::rated[quack qkv] flops=32614907904 dtype=bf16"
    assert parse_range(name) == {"label": "quack qkv", "flops": 32614907904, "bytes": None, "dtype": "bf16"}
    assert parse_range(range_name("copy", bytes=8)) == {"label": "copy", "flops": None, "bytes": 8, "dtype": None}


def test_a_torch_dtype_names_its_peak_key() -> None:
    """A caller passes its tensor's own dtype; one torch has no peak for is refused like a bad key."""
    torch = pytest.importorskip("torch")
    assert range_name("qkv", flops=1, dtype=torch.bfloat16) == "ditgate::rated[qkv] flops=1 dtype=bf16"
    assert range_name("qkv", flops=1, dtype=torch.float8_e4m3fn).endswith("dtype=fp8")
    with pytest.raises(DitgateUsageError, match="dtype must be one of .*got torch.int8"):
        range_name("qkv", flops=1, dtype=torch.int8)


@pytest.mark.parametrize("kwargs,message", [
    ({"flops": -1}, "flops must be a non-negative int"),
    ({"flops": True}, "flops must be a non-negative int"),
    ({"bytes": 1.5}, "bytes must be a non-negative int"),
    ({"flops": 1, "dtype": "bfloat16"}, "dtype must be one of"),
    ({}, "needs flops or bytes"),
])
def test_bad_amounts_are_usage_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(DitgateUsageError, match=message):
        range_name("x", **kwargs)
    with pytest.raises(DitgateUsageError, match="without brackets"):
        range_name("x[0]", flops=1)


@pytest.mark.parametrize("name", ["aten::mm", "ditgate::profile", "ditgate::rated[x] flops=-3",
                                  "ditgate::rated[x] flops=1; rm", "ditgate::rated[x]flops=1"])
def test_other_and_malformed_names_are_not_read_as_amounts(name: str) -> None:
    parsed = parse_range(name)
    assert parsed is None or (parsed["flops"] is None and parsed["bytes"] is None)


def trace() -> dict:
    """A rated DSL GEMM launched through a custom op (an op, but no FLOPs: quack's ``quack::gemm_out``), a
    rated copy with bytes only and no op at all, an aten GEMM inside a rated range keeping its own count, and
    a kernel just outside a range."""
    return {"traceEvents": [
        _range(range_name("quack qkv", flops=8_000_000_000, dtype="bf16"), 0.0, 10.0),
        _kernel(GEMM, 0.0, 10.0, op=60), _op("quack::gemm_out", 60),
        _range(range_name("copy", bytes=4_000_000), 20.0, 1.0), _kernel(COPY, 20.0, 1.0),
        _range(range_name("outer", flops=1), 40.0, 10.0), _kernel("nvjet_tst_bias_TNN", 40.0, 10.0, op=53),
        _kernel("after_the_range", 51.0, 2.0),
    ]}


def test_a_rated_launch_gets_its_rates_in_the_profile() -> None:
    profile = summarize_trace(trace(), {53: (2_000_000_000, "bf16")}, label="fwd", peaks=PEAKS)
    rows = {k["name"]: k for k in profile.kernels}
    gemm, copy, inner = rows[GEMM], rows[COPY], rows["nvjet_tst_bias_TNN"]
    assert gemm["flops"] == 8_000_000_000 and gemm["tflops"] == pytest.approx(800.0)
    assert gemm["tflops_fraction"] == pytest.approx(1.0)
    assert copy["bytes"] == 4_000_000 and copy["gbps"] == pytest.approx(4000.0)
    assert inner["flops"] == 2_000_000_000  # its op's count, not the outer range's
    assert "flops" not in rows["after_the_range"]
    assert profile.gemm["coverage"] == 1.0


def test_nested_ranges_credit_the_innermost_first_and_flops_only_says_so() -> None:
    events = [_range(range_name("block", flops=100), 0.0, 30.0), _kernel("outer_gemm_kernel", 0.0, 15.0),
              _range(range_name("qkv", flops=7), 20.0, 10.0), _kernel("inner_gemm_kernel", 20.0, 10.0)]
    rows = {k["name"]: k for k in summarize_trace({"traceEvents": events}, {}, label="x", peaks=PEAKS).kernels}
    assert rows["inner_gemm_kernel"]["flops"] == 7 and rows["outer_gemm_kernel"]["flops"] == 100
    from pytest_ditgate.bench.profiling import RATED_NO_BYTES, activities_from_trace

    _, activities, _ = activities_from_trace({"traceEvents": events})
    assert {a.bytes_why for a in activities} == {RATED_NO_BYTES}


def test_without_the_ranges_those_launches_have_no_rates() -> None:
    bare = {"traceEvents": [e for e in trace()["traceEvents"] if e["cat"] != "gpu_user_annotation"]}
    rows = {k["name"]: k for k in summarize_trace(bare, {}, label="fwd", peaks=PEAKS).kernels}
    assert "tflops" not in rows[GEMM] and "gbps" not in rows[COPY]


def test_rated_records_a_range_only_while_a_profiler_records() -> None:
    torch = pytest.importorskip("torch")
    with rated("x", flops=-1):  # outside a profiler: nothing is built, nothing checked
        pass
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with rated("add", flops=10, dtype="fp32"):
            torch.ones(4) + 1
    assert "ditgate::rated[add] flops=10 dtype=fp32" in [e.name for e in prof.events()]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        with pytest.raises(DitgateUsageError, match="flops must be"):
            with rated("x", flops=-1):
                pass


def test_the_fast_dits_quack_gemms_are_rated() -> None:
    torch = pytest.importorskip("torch")
    from dit_impl.fast import gemms

    class StandIn:
        def gemm(self, a, b, bias=None):
            return torch.addmm(bias, a, b)

        def gemm_act(self, a, b, bias=None, activation=None, store_preact=True):
            return None, torch.nn.functional.gelu(torch.addmm(bias, a, b), approximate="tanh")

    chosen = gemms.quack_gemms(StandIn(), "stand-in")
    x, qkv, fc1 = torch.randn(2, 16, 8), torch.nn.Linear(8, 24), torch.nn.Linear(8, 32)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        chosen.qkv(x, qkv)
        chosen.fc1_gelu(x, fc1)
    names = [e.name for e in prof.events() if e.name.startswith("ditgate::rated")]
    assert names == [f"ditgate::rated[quack qkv] flops={2 * 32 * 8 * 24} dtype=fp32",
                     f"ditgate::rated[quack fc1+gelu] flops={2 * 32 * 8 * 32} dtype=fp32"]


def test_the_fast_dits_adaln_kernels_are_rated_with_their_bytes(monkeypatch) -> None:
    """``adaln=kernels`` launches through the kernels package's own binding (no torch op): each launch is rated
    with what it reads and writes, and the arithmetic is the package's, unchanged."""
    torch = pytest.importorskip("torch")
    import types

    from dit_impl.fast import adaln

    package = types.ModuleType("kernels")
    package.layernorm_modulate = lambda x, scale, shift, eps: adaln.norm_modulate(x, shift, scale, eps)
    package.gated_residual = lambda x, gate, y: adaln.gated_residual(x, gate, y)
    package.gated_residual_layernorm_modulate = (
        lambda x, gate, y, scale, shift, eps: adaln.residual_norm_modulate(x, gate, y, shift, scale, eps))
    monkeypatch.setitem(sys.modules, "kernels", package)
    ops = adaln.resolve_ops("kernels", "cuda", compiled=False)
    assert ops.impl == "kernels", ops.reason
    x, y = torch.randn(2, 16, 8), torch.randn(2, 16, 8)  # 1 KiB each in float32
    gate, shift, scale = torch.randn(2, 8), torch.randn(2, 8), torch.randn(2, 8)  # 64 B each
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = ops.norm_modulate(x, shift, scale, 1e-6)
        x_new = ops.gated_residual(x, gate, y)
        fused_x, fused_out = ops.residual_norm_modulate(x, gate, y, shift, scale, 1e-6)
    names = [e.name for e in prof.events() if e.name.startswith("ditgate::rated")]
    assert names == ["ditgate::rated[adaln norm_modulate] bytes=2176",  # x in, out: 2 KiB; shift, scale
                     "ditgate::rated[adaln gated_residual] bytes=3136",  # x, y in, x_new out; gate
                     "ditgate::rated[adaln residual_norm_modulate] bytes=4288"]  # + out, shift, scale
    torch.testing.assert_close(out, adaln.norm_modulate(x, shift, scale, 1e-6), rtol=0, atol=0)
    torch.testing.assert_close(x_new, gate[:, None] * y + x, rtol=0, atol=0)
    torch.testing.assert_close((fused_x, fused_out), adaln.residual_norm_modulate(x, gate, y, shift, scale, 1e-6),
                               rtol=0, atol=0)
