"""The ``graph`` mechanism: calls captured in CUDA graphs, each replay timed with events, divided by the count.

Two effects make a replay read slower than the kernels inside it (measured on an H200, see
benchmarks/gpu/graph_gap_probe.py): the device waits a launch latency between dependent nodes (0.03 to
0.26 us between two kernels, about 0.8 us around a memset node), and that latency differs from one capture
of the same calls to the next (a 2 us add read 0 to 18 % slow over five captures). So each call is
captured ``GRAPH_CAPTURES`` times and the samples cycle through the captures; and where the profiler
works, one traced replay per capture gives its *floor* gap between nodes (the smallest one: tracing
stretches the others) and the number of device activities per call. Tracing also changes how a graph
runs: untraced replays of 2 us kernels paid 0.2 to 0.4 us more per node than traced ones showed. So the
device's per-node launch overhead is also calibrated once per process on a graph of empty kernels
(untraced replay time per node minus the empty kernel's traced duration). Per device activity of a call,
the larger of the two is subtracted. Without a profiler nothing is subtracted and the note says so.
"""

from __future__ import annotations

import math
import time
from typing import Any, Sequence

from pytest_ditgate.bench.timers import Call, HostOnlyError, TimingError, device_spans, profiled

#: a graph replay is sized to last about this long, so the fixed cost of a replay stays below 0.5 %
GRAPH_REPLAY_MS = 5.0
GRAPH_MAX_CALLS = 10_000
#: captures per call whose replays the samples cycle through (capture-to-capture spread of launch latency)
GRAPH_CAPTURES = 3
#: nodes of the empty-kernel calibration graph
CALIBRATION_NODES = 2000
_node_overhead_ms: dict[int, float] = {}

#: replays before sampling: clocks and caches settle (the first replays of a tiny kernel ran slower)
GRAPH_WARM_MS = 25.0


class CapturedGraph:
    """``count`` calls captured in one CUDA graph; calls cycle through ``variants`` (rotated input copies).

    Graphs given the same ``pool`` share one memory pool, so that two graphs of a pair place their
    outputs alike (two private pools made identical ops differ by about 0.4 % on an H200).
    ``gap_ms`` is the launch latency subtracted per device activity (0 until measured).
    """

    def __init__(self, variants: Sequence[Call], count: int, pool: Any = None) -> None:
        import torch

        self.count = count
        self.gap_ms = 0.0
        self.activities_per_call = 0.0
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for variant in variants[:3]:
                variant()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(self.graph, pool=pool):
                for i in range(count):
                    variants[i % len(variants)]()
        except Exception as exc:
            raise TimingError(f"CUDA graph capture failed: {type(exc).__name__}: {exc}") from exc
        self.graph.replay()
        torch.cuda.synchronize()
        if self.time_replay() <= 0:
            raise HostOnlyError("the captured graph holds no device work")

    def time_replay(self) -> float:
        """Milliseconds per call of one replay, launch gaps included."""
        import torch

        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        self.graph.replay()
        end.record()
        torch.cuda.synchronize()
        return float(start.elapsed_time(end)) / self.count

    @property
    def subtract_ms(self) -> float:
        """Launch latency per call: the floor gap times the device activities of one call."""
        return self.gap_ms * self.activities_per_call


class GraphSet:
    """The captures of one call (same count, one shared pool); sample ``k`` replays capture ``k % len``."""

    def __init__(self, captures: Sequence[CapturedGraph]) -> None:
        self.captures = list(captures)
        self.count = self.captures[0].count
        self.taken = 0

    def next_capture(self) -> CapturedGraph:
        capture = self.captures[self.taken % len(self.captures)]
        self.taken += 1
        return capture

    def time_replay(self) -> float:
        return self.captures[0].time_replay()


def probe_per_call_ms(variants: Sequence[Call]) -> float:
    """Per-call time from a small graph (no launch overhead, unlike a host-clock estimate)."""
    probe = CapturedGraph(variants, 10)
    return min(probe.time_replay() for _ in range(3))


def capture_graphs(variant_sets: Sequence[Sequence[Call]], *, replay_ms: float = GRAPH_REPLAY_MS,
                   max_calls: int = GRAPH_MAX_CALLS, captures: int = GRAPH_CAPTURES) -> list[GraphSet]:
    """``captures`` graphs per variant set, all with the same call count (sized so the slowest replay lasts
    about ``replay_ms``, at least one pass over every variant) in one shared memory pool."""
    import torch

    per_call = max(probe_per_call_ms(v) for v in variant_sets)
    most = max(len(v) for v in variant_sets)
    count = max(most, min(math.ceil(replay_ms / max(per_call, 1e-6)), max_calls))
    count = math.ceil(count / most) * most
    pool = torch.cuda.graph_pool_handle()
    return [GraphSet([CapturedGraph(v, count, pool) for _ in range(captures)]) for v in variant_sets]


def _traced_spans(replay: Any) -> list[tuple[int, int]]:
    """Device activity spans of one traced ``replay()`` (TimingError when the profiler cannot trace)."""
    import torch

    return device_spans(profiled(replay), torch.autograd.DeviceType.CUDA)


def node_overhead_ms() -> float:
    """The current device's launch overhead per graph node, once per process: an untraced replay of
    CALIBRATION_NODES empty kernels per node, minus the empty kernel's own (traced) duration."""
    import statistics

    import torch

    device = torch.cuda.current_device()
    if device not in _node_overhead_ms:
        try:
            capture = CapturedGraph([Call(torch.cuda._sleep, (0,))], CALIBRATION_NODES)
        except (AttributeError, RuntimeError) as exc:  # no torch.cuda._sleep in this torch
            raise TimingError(f"node overhead calibration failed: {type(exc).__name__}: {exc}") from exc
        per_node = statistics.median(capture.time_replay() for _ in range(10))
        spans = _traced_spans(capture.graph.replay)
        if len(spans) < CALIBRATION_NODES:
            raise TimingError(f"the profiler recorded {len(spans)} of {CALIBRATION_NODES} calibration kernels")
        duration = statistics.median(end - start for start, end in spans) / 1e6
        _node_overhead_ms[device] = max(0.0, per_node - duration)
    return _node_overhead_ms[device]


def launch_gap(capture: CapturedGraph) -> tuple[float, float]:
    """(floor gap between consecutive device activities in ms, activities per call) from one traced replay.

    Overlapping activities (a call that uses several streams) give a floor of 0: nothing to subtract.
    """
    spans = _traced_spans(capture.graph.replay)
    if len(spans) < capture.count:
        raise TimingError(f"the profiler recorded {len(spans)} device activities for {capture.count} calls")
    return floor_gap_ns(spans) / 1e6, len(spans) / capture.count


def floor_gap_ns(spans: Sequence[tuple[int, int]]) -> int:
    """Smallest gap between consecutive activities (start order); 0 when any overlap or fewer than two."""
    gaps = [later[0] - earlier[1] for earlier, later in zip(spans, spans[1:])]
    return max(0, min(gaps)) if gaps else 0


def measure_launch_gaps(sets: Sequence[GraphSet]) -> float:
    """Set ``gap_ms`` (the larger of the capture's floor gap and the device's node overhead) and
    ``activities_per_call`` of every capture; returns the node overhead (TimingError: no profiler)."""
    overhead = node_overhead_ms()
    for graph_set in sets:
        for capture in graph_set.captures:
            floor, capture.activities_per_call = launch_gap(capture)
            capture.gap_ms = max(floor, overhead)
    return overhead


def time_graphs(sets: Sequence[GraphSet], order: Sequence[int]) -> tuple[list[list[float]], list[list[float]]]:
    """One replay per schedule entry after about GRAPH_WARM_MS of warm-up replays of every capture.

    Returns (samples with each capture's launch latency subtracted, raw samples), ms per call.
    """
    import torch

    for graph_set in sets:
        for capture in graph_set.captures:
            start = time.perf_counter()
            for done in range(1000):
                capture.graph.replay()
                torch.cuda.synchronize()
                if done >= 2 and (time.perf_counter() - start) * 1e3 >= GRAPH_WARM_MS / len(graph_set.captures):
                    break
    samples: list[list[float]] = [[] for _ in sets]
    raw: list[list[float]] = [[] for _ in sets]
    for index in order:
        capture = sets[index].next_capture()
        value = capture.time_replay()
        raw[index].append(value)
        samples[index].append(value - capture.subtract_ms)
    return samples, raw
