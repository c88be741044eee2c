"""GPU tests for each timing mechanism (skipped without a CUDA GPU; run with ``--ditgate``).

They assert behaviour, not speed: which mechanism measured, the regime, cold L2, that the mechanisms
agree with each other on a kernel long enough for launch overhead not to matter, that a 2x slower
candidate is caught by ``measure_pair``, and that a candidate whose kernels alone look faster but which waits
for the host inside the call is judged on its latency.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.requires_gpu(cc=">=8.0"), pytest.mark.ditgate]


@pytest.fixture(scope="module")
def tensors():
    import torch

    x = torch.randn(8 << 20, device="cuda", dtype=torch.bfloat16)
    return x, torch.randn_like(x)


def _add(x, y):
    import torch

    return torch.add(x, y)


@pytest.mark.parametrize("mechanism,regime", [("latency", "sustained"), ("cupti", "spaced"), ("graph", "sustained"),
                                              ("events", "spaced"), ("wall", "spaced")])
def test_each_mechanism_measures_and_says_so(tensors, mechanism: str, regime: str) -> None:
    from pytest_ditgate import measure

    m = measure(_add, *tensors, mechanism=mechanism, label=f"add-{mechanism}", dtype="bfloat16")
    assert m.mechanism == mechanism and m.regime == regime
    assert m.n >= 10 and m.median_ms > 0 and m.arch.startswith("sm_")
    assert m.driver and m.cuda and m.torch
    assert m.mechanism_notes[mechanism].startswith("chosen (requested)")
    if mechanism == "graph":
        assert m.calls_per_sample > 1


def test_auto_takes_the_latency_and_reports_busy_time_beside_it(tensors) -> None:
    from pytest_ditgate import measure

    m = measure(_add, *tensors)
    assert m.mechanism == "latency" and m.regime == "sustained"
    assert set(m.mechanism_notes) == {"latency", "events", "wall"}  # auto never takes a busy-time mechanism
    assert all(m.mechanism_notes[k].startswith("not used: latency worked") for k in ("events", "wall"))
    assert m.calls_per_sample >= 1 and m.extra["calls_per_batch"] == m.calls_per_sample
    # a device-bound add: the device is busy nearly all of its latency, and it never waits for the host
    assert 0 < m.extra["busy_median_ms"] <= 1.05 * m.median_ms and m.extra["idle_fraction"] < 0.25
    assert m.extra["host_syncs"] == 0


def test_mechanisms_agree_on_a_long_kernel(tensors) -> None:
    """A ~20 us memory-bound add: graph agrees with cupti within 10 %, and so does the busy time latency
    traced. Latency itself also counts the gaps between back-to-back launches (about 2 us on an H100: 18.7 us
    against cupti's 16.6), and on a busy host the time the device waits for the next launch (21.2 us once, 1.29x):
    it never reads faster than cupti, and less than 1.6x slower. Events and wall read slower, never faster."""
    from pytest_ditgate import measure

    runs = {mech: measure(_add, *tensors, mechanism=mech) for mech in ("latency", "cupti", "graph", "events", "wall")}
    got = {mech: m.median_ms for mech, m in runs.items()}
    busy = runs["latency"].extra["busy_median_ms"]
    assert abs(got["graph"] / got["cupti"] - 1) < 0.10, got
    assert abs(busy / got["cupti"] - 1) < 0.10, (got, busy)
    assert 0.95 <= got["latency"] / got["cupti"] < 1.6, got
    assert got["events"] >= 0.95 * got["cupti"] and got["wall"] >= 0.95 * got["cupti"], got


def _waits_for_the_host(x, y):
    """One add, then a value read on the host (``.item()``: a copy and a synchronisation), then host work the
    device waits through: fewer kernels than two adds, and a longer wait."""
    import time

    import torch

    z = torch.add(x, y, alpha=2)  # what _two_adds computes, in one kernel
    float(z[:1].float().item())
    until = time.perf_counter() + 200e-6
    while time.perf_counter() < until:
        pass
    return z


def _two_adds(x, y):
    import torch

    return torch.add(torch.add(x, y), y)


def test_a_pair_that_waits_for_the_host_is_judged_on_latency(ditbench, tensors) -> None:
    """The candidate's kernels take about half the reference's, so busy time alone claims it faster by far more
    than 15 %; end to end it waits for the host and is slower. The verdict follows the latency and says why."""
    from pytest_ditgate.errors import GateFailure

    with pytest.raises(GateFailure) as failed:
        ditbench.pair(_waits_for_the_host, _two_adds, *tensors, min_speedup=0.05)
    c = failed.value.report
    assert failed.value.reason == "too_slow" and c.a.mechanism == "latency"
    assert c.busy_ratio is not None and c.busy_ratio < 0.85, c.busy_ratio
    assert c.a.extra["host_syncs"] >= 1 and c.a.extra["idle_fraction"] > 0.3
    message = str(failed.value)
    assert "by busy time alone (kernel time only)" in message and "which would pass" in message
    assert "candidate: " in message and "% idle, host syncs: " in message


def test_graph_cannot_capture_a_call_that_synchronises_and_measures_its_latency(tensors) -> None:
    from pytest_ditgate import measure

    import torch

    m = measure(_waits_for_the_host, *tensors, mechanism="graph")
    assert m.mechanism == "latency"
    assert "synchronises with the host" in m.mechanism_notes["graph"]
    assert "measured by latency instead" in m.mechanism_notes["graph"]
    # the failed capture left the device's random generator usable (it had poisoned every later draw)
    assert torch.randn(8, device="cuda").isfinite().all()
    assert torch.nn.functional.dropout(torch.ones(8, device="cuda"), 0.5).numel() == 8


def test_cold_l2_is_slower_or_equal_and_recorded(tensors) -> None:
    import torch

    from pytest_ditgate import measure

    small = torch.randn(1 << 20, device="cuda", dtype=torch.bfloat16)
    for mechanism in ("cupti", "graph"):
        warm = measure(_add, small, small, mechanism=mechanism)
        cold = measure(_add, small, small, mechanism=mechanism, l2="cold")
        assert cold.l2_mode == "cold" and warm.l2_mode == "warm"
        assert cold.median_ms >= 0.9 * warm.median_ms, (mechanism, warm.median_ms, cold.median_ms)
    assert "rotating" in cold.mechanism_notes["graph"] and cold.extra["rotated_copies"] >= 2
    # events: the flush runs just before the start event, which hides launch latency; only check it is recorded
    assert measure(_add, small, small, mechanism="events", l2="cold").l2_mode == "cold"


def test_graph_cold_without_tensor_args_falls_back_with_a_note(tensors) -> None:
    from pytest_ditgate import measure
    from pytest_ditgate.errors import DitgateUsageError

    x, y = tensors
    # graph mode rotates tensor arguments for cold L2; a closure has none, and the note says so
    with pytest.raises(DitgateUsageError, match="graph: failed: cold L2 in a graph needs rotated inputs: .* has none"):
        measure(lambda: x + y, mechanism="graph", l2="cold")
    m = measure(lambda: x + y, mechanism="auto", l2="cold")
    assert m.mechanism == "latency" and m.calls_per_sample == 1
    m = measure(lambda: x + y, mechanism="events", l2="cold")
    assert m.mechanism == "events"


def test_graph_subtracts_idle_between_nodes_and_keeps_the_raw_time() -> None:
    """A 2 us add: queued replays read the device's time for the nodes; the default also takes off the
    floor gap of a traced queued replay per kernel, and keeps the raw median."""
    import torch

    from pytest_ditgate import measure

    small = torch.randn(1 << 20, device="cuda", dtype=torch.bfloat16)
    sub = measure(_add, small, small, mechanism="graph")
    keep = measure(_add, small, small, mechanism="graph", graph_idle="keep")
    assert sub.extra["graph_idle"] == "subtracted" and sub.extra["activities_per_call"] == 1.0
    assert sub.extra["captures"] == 3 and len(sub.extra["floor_gap_us"]) == 3
    assert all(0 <= gap < 1.0 for gap in sub.extra["floor_gap_us"])
    assert sub.extra["subtracted_per_call_us"] == pytest.approx(sub.extra["floor_gap_us"])
    assert sub.median_ms <= sub.extra["raw_median_ms"]
    assert "queued behind an untimed lead replay" in sub.mechanism_notes["graph"]
    assert "floor gap between graph nodes" in sub.mechanism_notes["graph"]
    assert keep.extra["graph_idle"] == "kept" and "kept (graph_idle='keep')" in keep.mechanism_notes["graph"]
    assert abs(sub.median_ms / keep.median_ms - 1) < 0.25


def test_sustained_cupti_regime(tensors) -> None:
    from pytest_ditgate import measure

    m = measure(_add, *tensors, mechanism="cupti", regime="sustained")
    assert m.regime == "sustained" and m.mechanism == "cupti"


def test_a_host_only_function_is_timed_by_the_host_clock() -> None:
    """A call that launches nothing is the host's work, timed as on a machine without a GPU (``wall``), and
    takes no GPU's timing lock: a CPU lane's pair keeps the host's noise floor on a GPU host too."""
    import torch  # noqa: F401  (CUDA in use, but the call launches nothing)

    from pytest_ditgate import measure

    m = measure(lambda: sum(range(100)))
    assert m.mechanism == "wall" and m.device == "cpu"
    assert m.mechanism_notes["latency"] == "not used: the call launches no device work"


def test_pair_catches_a_2x_slower_candidate(tensors) -> None:
    import torch

    from pytest_ditgate.bench import measure_pair

    x, y = tensors
    slow = lambda: (torch.add(x, y), torch.add(x, y))  # noqa: E731
    fast = lambda: torch.add(x, y)  # noqa: E731
    c = measure_pair(slow, fast)
    assert c.slower_by_at_least(0.5) and not c.faster_by_at_least(0.0)
    c = measure_pair(fast, slow, mechanism="graph")
    assert c.faster_by_at_least(0.3)


def test_nvml_clocks_recorded_when_available(tensors) -> None:
    from pytest_ditgate import measure
    from pytest_ditgate.bench import nvml

    m = measure(_add, *tensors, mechanism="events")
    if nvml._nvml() is None:
        pytest.skip("NVML not available on this host")
    assert m.clocks_start and m.clocks_start["sm_clock_mhz"] and m.clocks_end


def test_ditbench_fixture_on_gpu(ditbench, tensors) -> None:
    m = ditbench(_add, *tensors, label="add-8M", backend="torch")
    assert m.mechanism == "latency"
    ditbench.pair(_add, lambda x, y: (torch_add_twice(x, y)), *tensors, min_speedup=0.2)


def torch_add_twice(x, y):
    import torch

    torch.add(x, y)
    return torch.add(x, y)


PROFILED_SUITE = """
import torch

a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
b = torch.randn_like(a)


def step(a, b):
    return torch.nn.functional.gelu(a @ b) + a


def test_eager(ditbench):
    ditbench(step, a, b, label="eager")


def captured():
    step(a, b)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(a, b)
    return graph


def test_graph_replay(ditbench):
    ditbench(captured().replay, label="graph")


def test_graph_replay_with_its_eager_run(ditbench):
    ditbench(captured().replay, label="graph+eager", profile_eager=lambda: step(a, b))


import triton
import triton.language as tl

from pytest_ditgate import rated


@triton.jit
def _copy_kernel(src, dst, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + i, tl.load(src + i, mask=i < n), mask=i < n)


def triton_copy(src, dst):
    with rated("triton copy", bytes=2 * src.numel() * src.element_size()):
        _copy_kernel[(triton.cdiv(src.numel(), 1024),)](src, dst, src.numel(), BLOCK=1024)


def test_rated_raw_triton_launch(ditbench):
    src = torch.randn(1 << 24, device="cuda")
    ditbench(triton_copy, src, torch.empty_like(src), label="rated")
"""


def test_profile_option_on_a_real_cuda_op(pytester: pytest.Pytester) -> None:
    """``--ditgate-profile`` on a bf16 GEMM + GELU + add: the GEMM in the GEMM phase with TFLOP/s, the
    elementwise kernels in GB/s from their ops' shapes, idle against the timed median, a trace on disk;
    a CUDA graph replay's kernels are traced too (with no launching op, so no bytes), and given the same
    computation run eagerly (``profile_eager=``) they take its kernels' FLOPs and bytes; a raw Triton launch
    inside ``rated(bytes=...)`` gets its GB/s."""
    import json

    from pytest_ditgate.fsutil import read_jsonl

    pytester.makepyfile(PROFILED_SUITE)
    result = pytester.runpytest_subprocess("--ditgate", "--ditgate-profile", "-p", "no:benchmark",
                                           "-p", "no:randomly", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["test_eager[[]eager[]]*device*", "*GEMM, * TFLOP/s*",
                                 "*norm/elementwise, * GB/s*", "*idle: *% of the traced span*timed median*"])
    records = {r["measurement"]["label"]: r for r in read_jsonl(pytester.path / ".ditgate" / "bench.jsonl")[0]}
    (eager,) = records["eager"]["profiles"]
    assert eager["source"] == "device" and eager["phases"]["gemm"]["ms"] > 0
    gemm = next(k for k in eager["kernels"] if k["phase"] == "gemm")
    assert gemm["bound"] == "compute" and gemm["flops"] == 2 * 2048 ** 3 and gemm["tflops"] > 1
    elementwise = [k for k in eager["kernels"] if k["phase"] == "elementwise"]
    assert len(elementwise) >= 2 and all(k["bound"] == "memory" and k["gbps"] > 1 for k in elementwise)
    assert eager["timed_ms"] == records["eager"]["measurement"]["median_ms"]
    assert 0 <= eager["timed_idle"]["share"] < 1
    trace = json.loads((pytester.path / ".ditgate" / eager["trace"]).read_text())
    assert any(e.get("cat") == "kernel" for e in trace["traceEvents"])
    (graph,) = records["graph"]["profiles"]
    assert graph["source"] == "device" and graph["phases"]["gemm"]["ms"] > 0  # the replay's kernels
    replayed = [k for k in graph["kernels"] if k["phase"] == "elementwise"]
    assert replayed and all("gbps" not in k and k["bytes_unknown"] for k in replayed)
    (lent,) = records["graph+eager"]["profiles"]
    gemm = next(k for k in lent["kernels"] if k["phase"] == "gemm")
    assert gemm["flops"] == 2 * 2048 ** 3 and gemm["tflops"] > 1 and lent["gemm"]["coverage"] == 1.0
    assert all(k["gbps"] > 1 for k in lent["kernels"] if k["phase"] == "elementwise")
    assert any("by launch order" in note for note in lent["notes"]), lent["notes"]
    assert (pytester.path / ".ditgate" / lent["trace"].replace(".json", "-eager.json")).is_file()
    (rated,) = records["rated"]["profiles"]
    copy = next(k for k in rated["kernels"] if k["name"].startswith("_copy_kernel"))
    assert copy["bytes"] == 2 * 4 * (1 << 24) and copy["gbps"] > 100, copy
