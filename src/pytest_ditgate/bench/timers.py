"""The four timing mechanisms. Each times a *schedule* of calls (one function, or A B B A interleaved).

- ``cupti``: kernel activity from the CUDA profiler (``torch.profiler``): per call, the time the device was
  busy with it (union of its kernel/memcpy/memset intervals). The span from first start to last end is
  kept too: where it is much longer, the device sat idle waiting for the host (a launch-bound call).
- ``graph``: a CUDA graph of many calls replayed and timed with events, divided by the count
  (back-to-back: the *sustained* regime). The device idles ~0.1 us between graph nodes; where the profiler
  works, one traced replay gives the busy fraction of a replay and the samples are scaled by it.
- ``events``: CUDA events around each call, all streams synchronised after it.
- ``wall``: host clock around each call with a device synchronisation (the only one without a GPU).

torch is imported inside the functions. A mechanism that cannot measure raises :class:`TimingError`
with a reason that ends up in ``Measurement.mechanism_notes``.
"""

from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

#: user annotation that brackets each timed call in the profiler trace
CALL_RANGE = "ditgate::call"
#: a graph replay is sized to last about this long, so the fixed cost of a replay stays below 0.5 %
GRAPH_REPLAY_MS = 5.0
GRAPH_MAX_CALLS = 10_000


class TimingError(RuntimeError):
    """This mechanism cannot time this call here (the reason says why)."""


class HostOnlyError(TimingError):
    """The call launched no device work: only the host clock can time it."""


@dataclass
class Call:
    """A function bound to its arguments."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __call__(self) -> Any:
        return self.fn(*self.args, **self.kwargs)


def cuda_in_use() -> bool:
    """True when torch is imported with a usable CUDA device (never imports torch itself)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_available())
    except Exception:
        return False


def synchronize() -> None:
    """Wait for every stream of the current device (a no-op without CUDA)."""
    if cuda_in_use():
        import torch

        torch.cuda.synchronize()


def _maybe(flush: Callable[[], None] | None) -> None:
    if flush is not None:
        flush()


def time_wall(calls: Sequence[Call], order: Sequence[int], *, flush: Callable[[], None] | None = None) -> list[list[float]]:
    """Host clock around each call, with a device synchronisation before and after."""
    samples: list[list[float]] = [[] for _ in calls]
    clock = time.perf_counter
    for index in order:
        _maybe(flush)
        synchronize()
        start = clock()
        calls[index]()
        synchronize()
        samples[index].append((clock() - start) * 1e3)
    return samples


def time_events(calls: Sequence[Call], order: Sequence[int], *, flush: Callable[[], None] | None = None) -> list[list[float]]:
    """CUDA events on the current stream around each call; the device is synchronised after each one."""
    import torch

    pending = []
    for index in order:
        _maybe(flush)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        calls[index]()
        end.record()
        torch.cuda.synchronize()
        pending.append((index, start, end))
    samples: list[list[float]] = [[] for _ in calls]
    for index, start, end in pending:
        samples[index].append(float(start.elapsed_time(end)))
    return samples


def _device_spans(events: Sequence[Any], device_type: Any) -> list[tuple[int, int]]:
    spans = []
    for event in events:
        if event.device_type() != device_type:
            continue
        name = event.name()
        if name.startswith("ditgate::") or event.is_user_annotation():
            continue
        spans.append((int(event.start_ns()), int(event.end_ns())))
    spans.sort()
    return spans


def assign_spans(ranges: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """Device activity spans grouped by the host range that contains their midpoint (ranges sorted, disjoint)."""
    starts = [r[0] for r in ranges]
    groups: list[list[tuple[int, int]]] = [[] for _ in ranges]
    for span in spans:
        middle = (span[0] + span[1]) / 2
        slot = bisect.bisect_right(starts, middle) - 1
        if slot >= 0 and middle <= ranges[slot][1]:
            groups[slot].append(span)
    return groups


def chunk_spans(spans: Sequence[tuple[int, int]], calls: int) -> list[list[tuple[int, int]]]:
    """Device spans in stream order cut into ``calls`` equal groups (back-to-back calls, same kernels each)."""
    if calls <= 0 or not spans or len(spans) % calls:
        raise TimingError(f"{len(spans)} device activities do not divide into {calls} calls: "
                          "the call does not launch the same kernels every time")
    size = len(spans) // calls
    return [list(spans[i * size:(i + 1) * size]) for i in range(calls)]


def time_cupti(calls: Sequence[Call], order: Sequence[int], *, flush: Callable[[], None] | None = None,
               regime: str = "spaced") -> "CuptiSamples":
    """Device busy time per call from ``torch.profiler`` kernel activity (spans in ``.spans``)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    if regime == "sustained" and (flush is not None or len(set(order)) > 1):
        raise TimingError("sustained cupti timing takes one function and warm L2 only")
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for index in order:
                if regime == "spaced":
                    _maybe(flush)
                    torch.cuda.synchronize()
                with record_function(CALL_RANGE):
                    calls[index]()
                    if regime == "spaced":
                        torch.cuda.synchronize()
            torch.cuda.synchronize()
        events = prof.profiler.kineto_results.events()
    except TimingError:
        raise
    except Exception as exc:  # profiler busy (another profile running), CUPTI missing, ...
        raise TimingError(f"profiler unavailable: {type(exc).__name__}: {exc}") from exc
    cuda = torch.autograd.DeviceType.CUDA
    spans = _device_spans(events, cuda)
    if not spans:
        raise HostOnlyError("the profiler recorded no device activity for the call")
    if regime == "spaced":
        ranges = sorted((int(e.start_ns()), int(e.end_ns())) for e in events
                        if e.name() == CALL_RANGE and e.device_type() != cuda)
        if len(ranges) != len(order):
            raise TimingError(f"found {len(ranges)} call ranges in the trace for {len(order)} calls")
        groups = assign_spans(ranges, spans)
    else:
        groups = chunk_spans(spans, len(order))
    samples: list[list[float]] = [[] for _ in calls]
    spans_ms: list[list[float]] = [[] for _ in calls]
    for index, group in zip(order, groups):
        if not group:
            raise TimingError("a call had no device activity inside its range (trace clocks misaligned?)")
        samples[index].append(busy_ns(group) / 1e6)
        spans_ms[index].append((max(s[1] for s in group) - min(s[0] for s in group)) / 1e6)
    return CuptiSamples(samples, spans_ms)


class CuptiSamples(list):
    """Per-call device busy time (the samples) plus, in ``.spans``, first start to last end per call."""

    def __init__(self, busy: list[list[float]], spans: list[list[float]]) -> None:
        super().__init__(busy)
        self.spans = spans


def busy_ns(group: Sequence[tuple[int, int]]) -> int:
    """Length of the union of the activity intervals: the time the device was busy with this call."""
    total, current_start, current_end = 0, None, None
    for start, end in sorted(group):
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start
    return total


class CapturedGraph:
    """``count`` calls captured in one CUDA graph; calls cycle through ``variants`` (rotated input copies).

    Graphs given the same ``pool`` share one memory pool, so that two graphs of a pair place their
    outputs alike (two private pools made identical ops differ by about 0.4 % on an H200).
    """

    def __init__(self, variants: Sequence[Call], count: int, pool: Any = None) -> None:
        import torch

        self.count = count
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
        """Milliseconds per call of one replay."""
        import torch

        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        self.graph.replay()
        end.record()
        torch.cuda.synchronize()
        return float(start.elapsed_time(end)) / self.count


def replay_busy_fraction(graph: CapturedGraph, replays: int = 3) -> tuple[float, float]:
    """(busy fraction, kernels per call) of a replay, from the profiler trace of ``replays`` replays.

    Busy time is the union of the graph's kernel intervals; the rest of the replay's span is the idle gap
    the device leaves between dependent nodes (median over the replays).
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(replays):
                graph.graph.replay()
                torch.cuda.synchronize()
        events = prof.profiler.kineto_results.events()
    except Exception as exc:  # profiler busy (another profile running), CUPTI missing, ...
        raise TimingError(f"profiler unavailable: {type(exc).__name__}: {exc}") from exc
    spans = _device_spans(events, torch.autograd.DeviceType.CUDA)
    if not spans:
        raise TimingError("the profiler recorded no kernels of the graph replay")
    groups = chunk_spans(spans, replays)
    fractions = sorted(busy_ns(g) / max(1, max(s[1] for s in g) - min(s[0] for s in g)) for g in groups)
    return min(1.0, fractions[len(fractions) // 2]), len(groups[0]) / graph.count


def probe_per_call_ms(variants: Sequence[Call]) -> float:
    """Per-call time from a small graph (no launch overhead, unlike a host-clock estimate)."""
    probe = CapturedGraph(variants, 10)
    return min(probe.time_replay() for _ in range(3))


def capture_graphs(variant_sets: Sequence[Sequence[Call]], *, replay_ms: float = GRAPH_REPLAY_MS,
                   max_calls: int = GRAPH_MAX_CALLS) -> list[CapturedGraph]:
    """One graph per variant set, all with the same call count (sized so the slowest replay lasts about
    ``replay_ms``, at least one pass over every variant) and one shared memory pool."""
    import torch

    per_call = max(probe_per_call_ms(v) for v in variant_sets)
    most = max(len(v) for v in variant_sets)
    count = max(most, min(math.ceil(replay_ms / max(per_call, 1e-6)), max_calls))
    count = math.ceil(count / most) * most
    pool = torch.cuda.graph_pool_handle()
    return [CapturedGraph(v, count, pool) for v in variant_sets]


#: replays before sampling: clocks and caches settle (the first replays of a tiny kernel ran slower)
GRAPH_WARM_MS = 25.0


def time_graphs(graphs: Sequence[CapturedGraph], order: Sequence[int]) -> list[list[float]]:
    """One replay per schedule entry, ms per call (after about GRAPH_WARM_MS of warm-up replays)."""
    import torch

    samples: list[list[float]] = [[] for _ in graphs]
    for graph in graphs:
        start = time.perf_counter()
        for done in range(1000):
            graph.graph.replay()
            torch.cuda.synchronize()
            if done >= 2 and (time.perf_counter() - start) * 1e3 >= GRAPH_WARM_MS:
                break
    for index in order:
        samples[index].append(graphs[index].time_replay())
    return samples
