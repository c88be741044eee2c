"""The ``graph`` mechanism: calls captured in a CUDA graph, each replay timed with events, divided by the count.

A replay reads slower than the kernels inside it: the device waits a launch latency between dependent
nodes. On an H200 (benchmarks/gpu/graph_capture_probe.py) that latency is a state of the device, not of a
capture: it toggled between two levels about 0.18 us per node apart a few times a second, moving every
graph alike, so a 2 us add read 9 % or 19 % slow depending on the moment while its difference from an
empty-kernel graph replayed next to it stayed within 2 %. So, where the profiler works, a graph of empty
kernels (the *latency probe*) is replayed between blocks of samples (at most 5 % of the time, so a busy GPU
does not rest), and each sample loses the latency read just before and after its block (per-node replay
time minus the empty kernel's traced duration) per device activity of the call, or the call's floor gap
from a traced replay where that is larger (gaps around memset nodes); a block during which the latency
changed is retaken. Without a profiler nothing is subtracted and the note says so.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from pytest_ditgate.bench.timers import Call, HostOnlyError, TimingError, device_spans, profiled

#: a graph replay is sized to last about this long, so the fixed cost of a replay stays below 0.5 %
GRAPH_REPLAY_MS = 5.0
GRAPH_MAX_CALLS = 10_000
#: empty-kernel nodes of the latency probe graph (about 1 ms a replay on an H200)
PROBE_NODES = 1000
#: the probe takes at most this share of the sampling time: its empty kernels let a busy GPU rest, and
#: resting after every sample turned the sustained regime of a 4096^3 matmul into a spaced one
PROBE_SHARE = 0.05
#: probe readings around a block of samples agree within the larger of this and 10 %: the latency did not
#: change during the block (its two levels on an H200 were 0.18 us apart); otherwise the block is retaken
SETTLED_MS = 0.05e-3
RETAKES = 3
_probes: dict[int, "LatencyProbe"] = {}

#: replays before sampling: clocks and caches settle (the first replays of a tiny kernel ran slower)
GRAPH_WARM_MS = 25.0


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
        """Milliseconds per call of one replay, launch gaps included."""
        import torch

        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        self.graph.replay()
        end.record()
        torch.cuda.synchronize()
        return float(start.elapsed_time(end)) / self.count


def probe_per_call_ms(variants: Sequence[Call]) -> float:
    """Per-call time from a small graph (no launch overhead, unlike a host-clock estimate)."""
    probe = CapturedGraph(variants, 10)
    return min(probe.time_replay() for _ in range(3))


def capture_graphs(variant_sets: Sequence[Sequence[Call]], *, replay_ms: float = GRAPH_REPLAY_MS,
                   max_calls: int = GRAPH_MAX_CALLS) -> list[CapturedGraph]:
    """One graph per variant set, all with the same call count (sized so the slowest replay lasts about
    ``replay_ms``, at least one pass over every variant) in one shared memory pool."""
    import torch

    per_call = max(probe_per_call_ms(v) for v in variant_sets)
    most = max(len(v) for v in variant_sets)
    count = max(most, min(math.ceil(replay_ms / max(per_call, 1e-6)), max_calls))
    count = math.ceil(count / most) * most
    pool = torch.cuda.graph_pool_handle()
    return [CapturedGraph(v, count, pool) for v in variant_sets]


def _traced_spans(replay: Any) -> list[tuple[int, int]]:
    """Device activity spans of one traced ``replay()`` (TimingError when the profiler cannot trace)."""
    import torch

    return device_spans(profiled(replay), torch.autograd.DeviceType.CUDA)


class LatencyProbe:
    """A graph of PROBE_NODES empty kernels whose untraced replay, less the empty kernel's own traced
    duration, reads the device's launch latency per graph node at that moment."""

    def __init__(self) -> None:
        import torch

        try:
            self.capture = CapturedGraph([Call(torch.cuda._sleep, (0,))], PROBE_NODES)
        except (AttributeError, RuntimeError) as exc:  # no torch.cuda._sleep in this torch
            raise TimingError(f"launch latency probe failed: {type(exc).__name__}: {exc}") from exc
        spans = _traced_spans(self.capture.graph.replay)
        if len(spans) < PROBE_NODES:
            raise TimingError(f"the profiler recorded {len(spans)} of {PROBE_NODES} latency probe kernels")
        self.kernel_ms = statistics.median(end - start for start, end in spans) / 1e6

    def read_ms(self) -> float:
        """Launch latency per graph node now: two replays of the probe, the second one timed (the first
        replay of a graph after another graph's replays read 0.13-0.16 us per node slower on an H200)."""
        self.capture.graph.replay()
        return max(0.0, self.capture.time_replay() - self.kernel_ms)

    @property
    def replay_ms(self) -> float:
        """About how long one reading keeps the device on empty kernels (two replays)."""
        return 2 * self.capture.count * self.kernel_ms


def settled(before: float, after: float) -> bool:
    """Two latency readings that show no change of the device's latency state between them."""
    return abs(after - before) <= max(SETTLED_MS, 0.1 * max(before, after))


def latency_probe() -> LatencyProbe:
    """The current device's latency probe, made once per process."""
    import torch

    device = torch.cuda.current_device()
    if device not in _probes:
        _probes[device] = LatencyProbe()
    return _probes[device]


def measure_floor_gaps(captures: Sequence[CapturedGraph]) -> LatencyProbe:
    """Set ``floor_ms`` and ``activities_per_call`` of every capture from one traced replay each; returns
    the device's latency probe (TimingError: no profiler)."""
    probe = latency_probe()
    for capture in captures:
        spans = _traced_spans(capture.graph.replay)
        if len(spans) < capture.count:
            raise TimingError(f"the profiler recorded {len(spans)} device activities for {capture.count} calls")
        capture.floor_ms, capture.activities_per_call = floor_gap_ns(spans) / 1e6, len(spans) / capture.count
    return probe


def floor_gap_ns(spans: Sequence[tuple[int, int]]) -> int:
    """Smallest gap between consecutive activities (start order); 0 when any overlap or fewer than two."""
    gaps = [later[0] - earlier[1] for earlier, later in zip(spans, spans[1:])]
    return max(0, min(gaps)) if gaps else 0


@dataclass
class GraphSamples:
    """Per call: samples (ms per call, latency subtracted), raw replay samples, what each lost, and the
    latency per node read beside each sample (empty without a probe); blocks retaken after the latency
    changed during them."""

    samples: list[list[float]]
    raw: list[list[float]]
    subtracted: list[list[float]] = field(default_factory=list)
    latency: list[list[float]] = field(default_factory=list)
    retaken: int = 0


def time_graphs(captures: Sequence[CapturedGraph], order: Sequence[int],
                probe: LatencyProbe | None = None) -> GraphSamples:
    """One replay per schedule entry after about GRAPH_WARM_MS of warm-up replays of every capture.

    With a ``probe``, the schedule runs in blocks with a probe reading before the first and after each
    block (a block is sized so the probe takes at most PROBE_SHARE of the time, and starts with an untimed
    replay after the probe's); a block whose readings disagree is retaken (up to RETAKES times), and each
    of its samples loses the mean of the two readings (or the capture's floor gap, if larger) per device
    activity.
    """
    import torch

    for capture in captures:
        start = time.perf_counter()
        for done in range(1000):
            capture.graph.replay()
            torch.cuda.synchronize()
            if done >= 2 and (time.perf_counter() - start) * 1e3 >= GRAPH_WARM_MS / len(captures):
                break
    result = GraphSamples(*([[] for _ in captures] for _ in range(4)))
    if probe is None:
        for index in order:
            value = captures[index].time_replay()
            result.raw[index].append(value)
            result.samples[index].append(value)
        return result
    before = statistics.median(probe.read_ms() for _ in range(3))
    replay_ms = min(c.count * c.time_replay() for c in captures)
    size = max(1, math.ceil(probe.replay_ms / (PROBE_SHARE * max(replay_ms, 1e-6))))
    for first in range(0, len(order), size):
        block = order[first:first + size]
        for attempt in range(RETAKES + 1):
            captures[block[0]].graph.replay()  # untimed: the first replay after the probe's pays the switch
            values = [captures[index].time_replay() for index in block]
            after = probe.read_ms()
            if settled(before, after) or attempt == RETAKES:
                break
            before = after
            result.retaken += 1
        latency, before = (before + after) / 2, after
        for index, value in zip(block, values):
            capture = captures[index]
            cut = max(capture.floor_ms, latency) * capture.activities_per_call
            result.raw[index].append(value)
            result.samples[index].append(value - cut)
            result.subtracted[index].append(cut)
            result.latency[index].append(latency)
    return result
