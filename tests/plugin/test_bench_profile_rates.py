"""Phase profiles judge each kernel by the right rate: memory-bound kernels in GB/s against the copy
peak (bytes from memcpy events or the launching op's recorded shapes, or "unknown" with the reason),
GEMMs in TFLOP/s; and idle is read against the timed (untraced) median as well as the traced span."""

from __future__ import annotations

import pytest

from pytest_ditgate.bench.profiling import NO_OP, summarize_trace
from pytest_ditgate.bench.report import idle_line, kernel_rate, profile_lines, profile_row
from pytest_ditgate.bench.traffic import op_bytes

PEAKS = {"tflops": {"bf16": 800.0}, "gbps": 4000.0, "source": "test", "profile": "test"}
BF16 = "c10::BFloat16"


def shapes(dims: list, types: list, strides: list | None = None) -> dict:
    args = {"Input Dims": dims, "Input type": types}
    return args if strides is None else dict(args, **{"Input Strides": strides})


@pytest.mark.parametrize("name,args,expected", [
    # read x, write an x-sized output; the scalar (None type) moves nothing
    ("aten::gelu", shapes([[1000, 1000], []], [BF16, ""]), 4_000_000),
    # broadcast operand: a [1000, 1] view with stride 0 holds 1000 elements
    ("aten::mul", shapes([[1000, 1000], [1000, 1000]], [BF16, BF16], [[1000, 1], [1, 0]]), 4_002_000),
    # in place: x read and written; copy_ reads src and only writes dst
    ("aten::add_", shapes([[1000], [], []], ["float", "double", "Scalar"]), 4000 + 8 + 4000),
    ("aten::copy_", shapes([[1000], [1000], []], [BF16, "float", "Scalar"]), 2000 + 4000),
    # GEMM: a [M, K] @ b [K, N] writes [M, N]
    ("aten::mm", shapes([[1, 4096], [4096, 4096]], [BF16, BF16]), 2 * (4096 + 4096 * 4096) + 2 * 4096),
    # reduction: the output is negligible
    ("aten::sum", shapes([[1000, 1000], []], ["float", ""]), 4_000_000),
    # sizes that cannot be known: no number
    ("aten::cat", shapes([[[64, 256], [64, 256]], []], ["TensorList", "Scalar"]), None),
    ("aten::empty_strided", shapes([[], []], ["ScalarList", "ScalarList"]), None),
    ("aten::gelu", {}, None),
])
def test_op_bytes_from_recorded_shapes(name: str, args: dict, expected: int | None) -> None:
    assert op_bytes(name, args) == expected


def _kernel(name: str, ts: float, dur: float, op: int | None = None) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "tid": 7, "ts": ts, "dur": dur,
            "args": {} if op is None else {"External id": op}}


def _op(name: str, op: int, args: dict) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "tid": 1, "ts": -5.0, "dur": 1.0,
            "args": dict(args, **{"External id": op})}


GELU = "vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>"
MUL = "vectorized_elementwise_kernel<4, MulFunctor>"
REPLAYED = "triton_poi_fused_add_0"
GEMV = "gemv2T_kernel_val<int, int, __nv_bfloat16, 128, 16, 4, 4>"
GEMM = "nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNT"


def memory_trace() -> dict:
    # us: gelu 0-10 | mul 20-30 | a graph-replayed add 40-50 (no launching op) | gemv 60-70 | GEMM 80-180
    return {"traceEvents": [
        _kernel(GELU, 0.0, 10.0, op=11), _op("aten::gelu", 11, shapes([[1000, 1000], []], [BF16, ""])),
        _kernel(MUL, 20.0, 10.0, op=12),
        _op("aten::mul", 12, shapes([[1000, 1000], [1000, 1000]], [BF16, BF16], [[1000, 1], [1, 0]])),
        _kernel(REPLAYED, 40.0, 10.0),
        _kernel(GEMV, 60.0, 10.0, op=13), _op("aten::mm", 13, shapes([[1, 4096], [4096, 4096]], [BF16, BF16])),
        _kernel(GEMM, 80.0, 100.0, op=14),
        _op("aten::mm", 14, shapes([[8192, 4096], [4096, 1220]], [BF16, BF16])),
    ]}


FLOPS = {12: (1_000_000, "bf16"), 13: (2 * 4096 * 4096, "bf16"), 14: (80_000_000_000, "bf16")}


def test_memory_bound_kernels_show_gbps_against_the_copy_peak_not_tflops() -> None:
    profile = summarize_trace(memory_trace(), FLOPS, label="fwd", peaks=PEAKS)
    rows = {k["name"]: k for k in profile.kernels}
    gelu, mul = rows[GELU], rows[MUL]
    assert gelu["bound"] == "memory" and gelu["bytes"] == 4_000_000
    assert gelu["gbps"] == pytest.approx(400.0) and gelu["gbps_fraction"] == pytest.approx(0.1)
    assert kernel_rate(gelu) == "400 GB/s (10% of copy peak)"
    # torch reported FLOPs for the mul: kept in the record, but the kernel is judged by its bytes
    assert mul["tflops"] == pytest.approx(0.1) and mul["bound"] == "memory"
    assert kernel_rate(mul) == "400.2 GB/s (10% of copy peak)"
    # a GEMM at its FLOP peak: TFLOP/s only
    assert rows[GEMM]["bound"] == "compute" and kernel_rate(rows[GEMM]) == "800 TFLOP/s (100% of bf16 peak)"
    # the GEMM-phase summary and the memory-bound summary (over the kernels whose bytes are known)
    assert profile.memory["gbps"] == pytest.approx(8_002_000 / 20e-6 / 1e9)
    assert profile.memory["coverage"] == pytest.approx(20 / 30)


def test_a_gemm_at_a_tiny_fraction_of_its_flop_peak_shows_its_bandwidth_too() -> None:
    profile = summarize_trace(memory_trace(), FLOPS, label="fwd", peaks=PEAKS)
    gemv = next(k for k in profile.kernels if k["name"] == GEMV)
    assert gemv["phase"] == "gemm" and gemv["bound"] == "memory"
    assert gemv["tflops_fraction"] < 0.05 and gemv["gbps_fraction"] == pytest.approx(33_570_816 / 10e-6 / 4e12)
    assert kernel_rate(gemv) == "3.36 TFLOP/s (0% of bf16 peak), 3357 GB/s (84% of copy peak)"


def test_where_bytes_cannot_be_known_the_profile_says_so_instead_of_a_number() -> None:
    profile = summarize_trace(memory_trace(), FLOPS, label="fwd", peaks=PEAKS)
    replayed = next(k for k in profile.kernels if k["name"] == REPLAYED)
    assert "gbps" not in replayed and replayed["bytes_unknown"] == NO_OP
    assert kernel_rate(replayed) == f"GB/s unknown: {NO_OP}"
    text = "\n".join(profile_lines([profile_row("t.py::test_fwd", profile.to_dict())]))
    assert "memory-bound: 400.1 GB/s over 67% of norm/elementwise + memcpy/memset time with known bytes, " \
           "10% of the copy peak" in text


def test_idle_is_read_against_the_timed_median_as_well_as_the_traced_span() -> None:
    # busy 140 us in a 180 us traced span (22 % idle); the untraced call took 150 us: (150 - 140) / 150 idle
    profile = summarize_trace(memory_trace(), FLOPS, label="fwd", peaks=PEAKS, timed_ms=0.150)
    assert profile.phases["idle"]["share"] == pytest.approx(40 / 180)
    assert profile.timed_ms == 0.150
    assert profile.timed_idle == pytest.approx({"ms": 0.010, "share": 10 / 150})
    line = idle_line(profile.to_dict())
    assert line == ("idle: 22.2% of the traced span (0.1800 ms); 6.7% of the timed median (0.1500 ms), "
                    "max(0, timed - busy 0.1400 ms) / timed")
    table = profile_lines([profile_row("t.py::test_fwd", profile.to_dict())])
    assert table[2].split()[-3:] == ["22.2%", "0.1500", "6.7%"]
    # the profiler made the device busier than the whole untraced call: no negative idle
    faster = summarize_trace(memory_trace(), FLOPS, label="fwd", timed_ms=0.100)
    assert faster.timed_idle == {"ms": 0.0, "share": 0.0}
    # without a timed median only the traced span is used, and the line says so
    untimed = summarize_trace(memory_trace(), FLOPS, label="fwd").to_dict()
    assert untimed["timed_idle"] == {} and idle_line(untimed) == "idle: 22.2% of the traced span (0.1800 ms)"


def test_on_the_cpu_an_op_owns_its_bytes_unless_its_child_ops_do_the_work() -> None:
    def host(name: str, ts: float, dur: float, op: int, args: dict) -> dict:
        return {"ph": "X", "cat": "cpu_op", "name": name, "tid": 1, "ts": ts, "dur": dur,
                "args": dict(args, **{"External id": op})}

    x = shapes([[256, 1024], []], ["float", ""])
    trace = {"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ditgate::profile", "tid": 1, "ts": 0.0, "dur": 100.0},
        # linear spends 40 of its 50 us in addmm: its child moves the bytes
        host("aten::linear", 0.0, 50.0, 1, shapes([[256, 1024], [1024, 1024]], ["float", "float"])),
        host("aten::addmm", 5.0, 40.0, 2, {}),
        # mul wraps its scalar in a tensor (a tiny child copy) but does the work itself
        host("aten::mul", 50.0, 40.0, 3, x), host("aten::copy_", 51.0, 1.0, 4, shapes([[], []], ["double", "double"])),
    ]}
    rows = {k["name"]: k for k in summarize_trace(trace, label="cpu").kernels}
    assert rows["aten::linear"].get("bytes") is None and "gbps" not in rows["aten::linear"]
    assert rows["aten::mul"]["bytes"] == 2 * 256 * 1024 * 4 and rows["aten::mul"]["bound"] == "memory"
    assert rows["aten::copy_"]["bytes"] == 16


def test_kernel_rate_of_a_malformed_ledger_entry_prints_no_number() -> None:
    assert kernel_rate({"phase": "gemm", "bound": "compute", "tflops": "fast"}) == ""
    assert kernel_rate({"phase": "elementwise", "bound": "memory", "gbps": None}) == "GB/s unknown: bytes not known"


def test_a_phase_rate_over_too_little_of_its_phase_is_not_printed() -> None:
    """A CUDA graph replay's kernels carry no bytes: an H200 profile printed "4.844 GB/s over 7% of ...,
    0% of the copy peak" for a forward whose elementwise kernels run near the copy peak."""
    data = summarize_trace(memory_trace(), FLOPS, label="fwd", peaks=PEAKS).to_dict()
    data["memory"] = dict(data["memory"], coverage=0.07)
    assert data["gemm"]["tflops"] is not None  # the trace has a GEMM with known FLOPs: both halves are judged
    data["gemm"] = dict(data["gemm"], coverage=0.2)
    text = "\n".join(profile_lines([profile_row("t.py::test_fwd", data)]))
    assert "memory-bound: bytes known for only 7% of norm/elementwise + memcpy/memset time; no rate" in text
    assert "GB/s over" not in text
    assert "GEMM: FLOPs known for only 20% of GEMM time; no rate" in text and "TFLOP/s over" not in text
