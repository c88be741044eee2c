"""The ``graph`` mechanism: calls captured in a CUDA graph, each replay timed with events, divided by the count.

A replay launched on an idle device reads slower than the device needs for its nodes: on an H200 a 2 us
add read 9 % or 19 % slow depending on the moment (the two levels toggled a few times a second and moved
every graph alike), while the same replay queued behind another one read within 2 % of the CUPTI kernel
time (benchmarks/gpu/graph_capture_probe.py, timer_fidelity). Launched on an idle device the nodes run as
the host's launch reaches the device; queued, the whole replay is on the device before it starts. So every
timed replay is queued behind an untimed *lead* replay of the same graph: the sample is the device's time
for the nodes back to back. Where a capture places its outputs still moved that add by up to 11 %, so each
call is captured GRAPH_CAPTURES times and the samples take the captures in turn. Where the profiler works, a traced queued replay *after* the samples (replays
right after a profiler session read up to 10 % fast) gives the floor gap between nodes (idle the device
spends between dependent nodes however they are launched) and the device activities per call;
``graph_idle="subtract"`` takes that floor off per activity.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from pytest_ditgate.bench.timers import Call, HostOnlyError, TimingError, device_spans, profiled

#: a graph replay is sized to last about this long, so the fixed cost of a replay stays below 0.5 %
GRAPH_REPLAY_MS = 5.0
GRAPH_MAX_CALLS = 10_000
#: captures per call, sampled in turn: where a capture places its outputs moved a 2 us add by up to 11 %
#: (queued replays on an H200), so one capture per side made A vs A pairs differ "significantly"
GRAPH_CAPTURES = 3
#: empty-kernel nodes of the graph that measures the floor gap tracing itself adds
TRACING_NODES = 200
_tracing_floor_ms: dict[int, float] = {}


class GraphSet:
    """The captures of one call (same count, one shared pool); sample ``k`` replays capture ``k % len``."""

    def __init__(self, captures: Sequence[CapturedGraph]) -> None:
        self.captures = list(captures)
        self.count = self.captures[0].count
        self.taken = 0

    def next_capture(self) -> tuple[int, CapturedGraph]:
        position = self.taken % len(self.captures)
        self.taken += 1
        return position, self.captures[position]


class CapturedGraph:
    """``count`` calls captured in one CUDA graph; calls cycle through ``variants`` (rotated input copies).

    Graphs given the same ``pool`` share one memory pool, so that the graphs of a pair place their outputs
    alike. ``floor_ms`` (smallest gap between nodes) and ``activities_per_call`` come from a traced replay
    (0 until measured).
    """

    def __init__(self, variants: Sequence[Call], count: int, pool: Any = None) -> None:
        import torch

        self.count = count
        self.floor_ms = 0.0
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
        """Milliseconds per call of one replay queued behind an untimed lead replay of the same graph."""
        import torch

        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        self.graph.replay()
        start.record()
        self.graph.replay()
        end.record()
        torch.cuda.synchronize()
        return float(start.elapsed_time(end)) / self.count

    def queued_spans(self) -> list[tuple[int, int]]:
        """Device activity spans of the timed half of a traced lead + timed replay pair."""
        import torch

        def pair() -> None:
            self.graph.replay()
            self.graph.replay()

        spans = device_spans(profiled(pair), torch.autograd.DeviceType.CUDA)
        return spans[len(spans) // 2:]


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


def tracing_floor_ms() -> float:
    """The floor gap that tracing alone puts between graph nodes on the current device, once per process:
    from a traced queued replay of TRACING_NODES empty kernels (0.13-0.19 us on an H200, where an untraced
    queued 2 us add ran 0.1 us per call faster than its traced busy time plus that gap)."""
    import torch

    device = torch.cuda.current_device()
    if device not in _tracing_floor_ms:
        try:
            empty = CapturedGraph([Call(torch.cuda._sleep, (0,))], TRACING_NODES)
        except (AttributeError, RuntimeError) as exc:  # no torch.cuda._sleep in this torch
            raise TimingError(f"tracing floor calibration failed: {type(exc).__name__}: {exc}") from exc
        _tracing_floor_ms[device] = floor_gap_ns(empty.queued_spans()) / 1e6
    return _tracing_floor_ms[device]


def measure_floor_gaps(captures: Sequence[CapturedGraph]) -> float:
    """Set ``floor_ms`` (floor gap of a traced queued replay beyond the tracing floor) and
    ``activities_per_call`` of every capture; returns the tracing floor (TimingError: no profiler)."""
    baseline = tracing_floor_ms()
    for capture in captures:
        spans = capture.queued_spans()
        if len(spans) < capture.count:
            raise TimingError(f"the profiler recorded {len(spans)} device activities for {capture.count} calls")
        capture.floor_ms = max(0.0, floor_gap_ns(spans) / 1e6 - baseline)
        capture.activities_per_call = len(spans) / capture.count
    return baseline


def floor_gap_ns(spans: Sequence[tuple[int, int]]) -> int:
    """Smallest gap between consecutive activities (start order); 0 when any overlap or fewer than two."""
    gaps = [later[0] - earlier[1] for earlier, later in zip(spans, spans[1:])]
    return max(0, min(gaps)) if gaps else 0


def time_graphs(sets: Sequence[GraphSet], order: Sequence[int]) -> tuple[list[list[float]], list[list[int]]]:
    """One queued replay per schedule entry, each call's captures in turn, after a few warm-up replays of
    every capture; returns (raw samples in ms per call, the capture each sample replayed)."""
    for graph_set in sets:
        for capture in graph_set.captures:
            for _ in range(3):
                capture.time_replay()
    raw: list[list[float]] = [[] for _ in sets]
    used: list[list[int]] = [[] for _ in sets]
    for index in order:
        position, capture = sets[index].next_capture()
        raw[index].append(capture.time_replay())
        used[index].append(position)
    return raw, used


def without_floor_gaps(sets: Sequence[GraphSet], raw: Sequence[Sequence[float]],
                       used: Sequence[Sequence[int]]) -> list[list[float]]:
    """Raw samples less their capture's floor gap per device activity (nothing where it was not measured)."""
    return [[v - s.captures[k].floor_ms * s.captures[k].activities_per_call for v, k in zip(r, u)]
            for s, r, u in zip(sets, raw, used)]
