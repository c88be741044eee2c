"""A CUDA graph replay's kernels have no launching op, so a phase profile of the replay alone shows no
TFLOP/s or GB/s for them. Given a trace of the same computation run eagerly, the profile lends each replayed
kernel the amounts of its eager counterpart: by launch order, or by name where every eager launch of that
name agrees; never a guess where they disagree."""

from __future__ import annotations

import pytest

from pytest_ditgate.bench.fixture import DitBench
from pytest_ditgate.bench.profiling import NO_OP, NO_OP_EAGER, summarize_trace
from pytest_ditgate.bench.timers import Call
from pytest_ditgate.bench.tracing import traced_eager
from pytest_ditgate.errors import DitgateUsageError

PEAKS = {"tflops": {"bf16": 800.0}, "gbps": 4000.0, "source": "test", "profile": "test"}
BF16 = "c10::BFloat16"
QKV = "nvjet_tst_192x192_bias_TNN"
MUL = "vectorized_elementwise_kernel<4, MulFunctor>"  # one kernel name for GEMMs of different sizes, as cuBLAS does
GELU = "vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>"
COPY = "direct_copy_kernel_cuda"


def _kernel(name: str, ts: float, dur: float, op: int | None = None, stream: int = 7) -> dict:
    args = {"stream": stream} if op is None else {"External id": op, "stream": stream}
    return {"ph": "X", "cat": "kernel", "name": name, "tid": 7, "ts": ts, "dur": dur, "args": args}


def _memset(ts: float, size: int) -> dict:
    return {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "tid": 7, "ts": ts, "dur": 1.0,
            "args": {"bytes": size, "stream": 7}}


def _op(name: str, op: int, dims: list, types: list) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "tid": 1, "ts": -5.0, "dur": 1.0,
            "args": {"External id": op, "Input Dims": dims, "Input type": types}}


def replay(names: list[str], copy_first: bool = False, streams: list[int] | None = None) -> dict:
    """A graph replay's trace: each kernel 10 us, none launched by an op, on stream 7 unless ``streams``
    says otherwise; optionally an input copy first (launched by ``aten::copy_``, as a graphed model refills
    its static inputs)."""
    events = [_kernel(COPY, 0.0, 2.0, op=1), _op("aten::copy_", 1, [[1000], [1000]], [BF16, BF16])] if copy_first else []
    streams = streams or [7] * len(names)
    events += [_kernel(name, 10.0 + 20 * i, 10.0, stream=stream) for i, (name, stream) in enumerate(zip(names, streams))]
    return {"traceEvents": events}


def eager(kernels: list[tuple[str, int | None]]) -> tuple[dict, dict]:
    """An eager run's trace and FLOPs: (name, FLOPs or None for an elementwise op with 4 MB of traffic, or
    -1 for a kernel no op launched, as a library's own launch)."""
    events, flops = [], {}
    for i, (name, count) in enumerate(kernels):
        op = 100 + i
        if count == -1:
            events.append(_kernel(name, 20.0 * i, 10.0))
            continue
        events.append(_kernel(name, 20.0 * i, 10.0, op=op))
        if count is None:
            events.append(_op("aten::gelu", op, [[1000, 1000], []], [BF16, ""]))
        else:
            events.append(_op("aten::addmm", op, [[1], [64, 64], [64, 64]], [BF16, BF16, BF16]))
            flops[op] = (count, "bf16")
    return {"traceEvents": events}, flops


def test_without_the_eager_run_a_replay_shows_no_rates() -> None:
    profile = summarize_trace(replay([QKV, GELU, QKV]), {}, label="graph", peaks=PEAKS)
    gemm = next(k for k in profile.kernels if k["phase"] == "gemm")
    gelu = next(k for k in profile.kernels if k["phase"] == "elementwise")
    assert "tflops" not in gemm and not profile.gemm
    assert "gbps" not in gelu and gelu["bytes_unknown"] == NO_OP


def test_replayed_kernels_take_their_eager_counterparts_amounts_by_launch_order() -> None:
    # the same kernel name with two sizes: only launch order can tell them apart
    trace, flops = eager([(QKV, 8_000_000_000), (GELU, None), (QKV, 2_000_000_000)])
    profile = summarize_trace(replay([QKV, GELU, QKV], copy_first=True), {}, eager=(trace, flops),
                              label="graph", peaks=PEAKS)
    by_phase = {k["phase"]: k for k in profile.kernels}
    gemm = by_phase["gemm"]
    assert gemm["count"] == 2 and gemm["flops"] == 10_000_000_000 and gemm["dtype"] == "bf16"
    assert gemm["tflops"] == pytest.approx(10e9 / 20e-6 / 1e12)  # two 10 us launches
    assert gemm["tflops_fraction"] == pytest.approx(gemm["tflops"] / 800.0)
    by_name = {k["name"]: k for k in profile.kernels}
    assert by_name[GELU]["gbps"] == pytest.approx(4e6 / 10e-6 / 1e9)
    assert by_name[COPY]["bytes"] == 4000  # the input copy, launched by its own op, keeps its own
    assert profile.gemm["coverage"] == 1.0 and profile.gemm["dtype"] == "bf16"
    (note,) = [n for n in profile.notes if "lent" in n]
    assert note.startswith("3 kernels without a launching op or amounts of their own")
    assert "3 lent by launch order, 0 matched in order to eager kernels without amounts, 0 lent by name; " \
           "0 left without amounts" in note


def test_order_is_matched_past_a_kernel_the_eager_run_does_not_have() -> None:
    """An extra op-less kernel at the replay's start must not shift the rest (a plain zip would)."""
    trace, flops = eager([(QKV, 8_000_000_000), (GELU, None), (QKV, 2_000_000_000)])
    profile = summarize_trace(replay([MUL, QKV, GELU, QKV]), {}, eager=(trace, flops), label="graph", peaks=PEAKS)
    by_name = {k["name"]: k for k in profile.kernels}
    assert by_name[QKV]["flops"] == 10_000_000_000 and by_name[GELU]["bytes"] == 4_000_000
    assert "tflops" not in by_name[MUL] and "gbps" not in by_name[MUL]
    assert any("3 lent by launch order" in n and "1 left without amounts" in n for n in profile.notes)


def test_a_replayed_memset_keeps_the_bytes_its_trace_gives_it() -> None:
    trace, flops = eager([(GELU, None)])
    trace["traceEvents"].append(_memset(-10.0, 64))
    profile = summarize_trace({"traceEvents": [_memset(0.0, 4), _kernel(GELU, 10.0, 10.0)]}, {},
                              eager=(trace, flops), label="graph", peaks=PEAKS)
    by_name = {k["name"]: k for k in profile.kernels}
    assert by_name["Memset (Device)"]["bytes"] == 4 and by_name[GELU]["bytes"] == 4_000_000
    assert any(n.startswith("1 kernels without a launching op") for n in profile.notes)


def test_several_streams_are_matched_by_name_only() -> None:
    """Start order interleaves streams: by order, the first b would take the second eager b's bytes."""
    trace, flops = eager([(MUL, None), (QKV, 8_000_000_000), (GELU, 1), (QKV, 8_000_000_000)])
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("name") != GELU]  # GELU: two sizes below
    extra, _ = eager([(GELU, None)])
    trace["traceEvents"] += extra["traceEvents"] + [_kernel(GELU, 200.0, 10.0, op=300),
                                                    _op("aten::gelu", 300, [[10, 10], []], [BF16, ""])]
    profile = summarize_trace(replay([QKV, GELU, QKV, GELU], streams=[7, 8, 7, 8]), {}, eager=(trace, flops),
                              label="graph", peaks=PEAKS)
    by_name = {k["name"]: k for k in profile.kernels}
    assert by_name[QKV]["flops"] == 16_000_000_000  # one amount for every eager QKV: lent by name
    assert "gbps" not in by_name[GELU]  # two eager sizes: no guess
    assert any("several streams, so by name only, 2 lent by name; 2 left without amounts" in n
               for n in profile.notes), profile.notes


def test_a_kernel_no_op_launched_even_eagerly_is_named_so() -> None:
    trace, flops = eager([(QKV, -1), (GELU, None)])
    profile = summarize_trace(replay([QKV, GELU]), {}, eager=(trace, flops), label="graph", peaks=PEAKS)
    by_name = {k["name"]: k for k in profile.kernels}
    assert "tflops" not in by_name[QKV] and by_name[GELU]["bytes"] == 4_000_000
    assert any("1 lent by launch order, 1 matched in order to eager kernels without amounts" in n
               for n in profile.notes)
    gemm_only = summarize_trace(replay([GELU]), {}, eager=eager([(GELU, -1)]), label="graph", peaks=PEAKS)
    assert gemm_only.kernels[0]["bytes_unknown"] == NO_OP_EAGER


def test_an_eager_run_that_raises_is_a_note_never_the_tests_failure(tmp_path) -> None:
    pytest.importorskip("torch")
    trace, note = traced_eager(Call(lambda: 1 / 0), tmp_path / "t-eager.json", on_gpu=False)
    assert trace is None and "profile_eager" in note and "ZeroDivisionError" in note


def test_an_unmatched_kernel_takes_amounts_by_name_only_when_they_agree() -> None:
    # the replay launches QKV before GELU; the eager run GELU first: order matches one of them, name the other
    trace, flops = eager([(GELU, None), (QKV, 8_000_000_000)])
    profile = summarize_trace(replay([QKV, GELU]), {}, eager=(trace, flops), label="graph", peaks=PEAKS)
    assert all(("tflops" in k) or ("gbps" in k) for k in profile.kernels)
    assert any("1 lent by launch order" in n and "1 lent by name; 0 left without amounts" in n
               for n in profile.notes), profile.notes
    # two eager sizes of QKV and the replay's QKV unmatched in order: no guess
    trace, flops = eager([(GELU, None), (QKV, 8_000_000_000), (QKV, 2_000_000_000), (COPY, None)])
    profile = summarize_trace(replay([COPY, QKV]), {}, eager=(trace, flops), label="graph", peaks=PEAKS)
    gemm = next(k for k in profile.kernels if k["phase"] == "gemm")
    assert "tflops" not in gemm and not profile.gemm
    assert any("0 lent by name; 1 left without amounts" in n for n in profile.notes), profile.notes


def test_a_matched_kernel_whose_eager_bytes_are_unknown_says_why_from_the_eager_run() -> None:
    events = [_kernel(GELU, 0.0, 10.0, op=7), {"ph": "X", "cat": "cpu_op", "name": "aten::gelu", "tid": 1,
                                               "ts": -5.0, "dur": 1.0, "args": {"External id": 7}}]
    profile = summarize_trace(replay([GELU]), {}, eager=({"traceEvents": events}, {}), label="graph", peaks=PEAKS)
    (gelu,) = profile.kernels
    assert "gbps" not in gelu and gelu["bytes_unknown"].endswith("(in the eager run)")
    assert gelu["bytes_unknown"] != NO_OP


def test_an_eager_run_without_device_activity_lends_nothing_and_says_so() -> None:
    profile = summarize_trace(replay([QKV]), {}, eager=({"traceEvents": []}, {}), label="graph", peaks=PEAKS)
    assert "tflops" not in profile.kernels[0]
    assert any("holds no device activity" in n for n in profile.notes)


def test_kernels_launched_by_ops_keep_their_own_amounts() -> None:
    trace, flops = eager([(QKV, 8_000_000_000)])
    own = {"traceEvents": [_kernel(QKV, 0.0, 10.0, op=5),
                           _op("aten::addmm", 5, [[1], [64, 64], [64, 64]], [BF16, BF16, BF16])]}
    profile = summarize_trace(own, {5: (1_000_000_000, "bf16")}, eager=(trace, flops), label="eager", peaks=PEAKS)
    assert profile.kernels[0]["flops"] == 1_000_000_000
    assert not any("lent" in n for n in profile.notes)  # nothing lacked an op: no note


def _bench(seen: list) -> DitBench:
    def profiler(call: Call, label: str, timed_ms: float, eager_call: Call | None) -> dict:
        seen.append((label, call, eager_call))
        return {"label": label, "source": "none"}

    return DitBench(test="t.py::test_x", lane="default", record_measurement=lambda m, p: None,
                    record_comparison=lambda c, s, ok, p: None, checks=lambda: [], profiler=profiler,
                    defaults={"mechanism": "wall", "l2": "warm"})


def work(n, step=1):
    return sum(range(0, n, step))


def test_ditbench_hands_the_eager_twin_to_the_profiler_with_the_calls_arguments() -> None:
    seen: list = []
    bench = _bench(seen)
    bench(work, 100, step=2, reps=3, warmup=1, profile=True, profile_eager=work)
    bench.pair(work, work, 100, step=3, rounds=10, warmup=1, min_speedup=None, profile=True,
               profile_eager=(None, work))
    bench.pair(work, work, 100, rounds=10, warmup=1, min_speedup=None, profile=True, profile_eager=[work, None])
    (label, call, twin), cand, ref, listed_cand, listed_ref = seen
    assert twin.fn is work and (twin.args, twin.kwargs) == ((100,), {"step": 2}) == (call.args, call.kwargs)
    assert cand[0] == "candidate" and cand[2] is None
    assert ref[0] == "reference" and ref[2].fn is work and ref[2].kwargs == {"step": 3}
    assert listed_cand[2].fn is work and listed_ref[2] is None  # a list pair is taken like a tuple


@pytest.mark.parametrize("method,value", [("measure", 3), ("measure", (work,)), ("pair", work),
                                          ("pair", (work,)), ("pair", (work, "x"))])
def test_a_malformed_profile_eager_is_a_usage_error_before_any_timing(method: str, value) -> None:
    seen: list = []
    bench = _bench(seen)
    with pytest.raises(DitgateUsageError, match="profile_eager must be"):
        if method == "measure":
            bench(work, 100, reps=3, profile=True, profile_eager=value)
        else:
            bench.pair(work, work, 100, rounds=10, profile=True, profile_eager=value)
    assert not seen and not bench.measurements and not bench.comparisons
