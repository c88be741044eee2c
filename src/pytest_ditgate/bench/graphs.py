"""The ``graph`` mechanism: calls captured in a CUDA graph, each replay timed with events, divided by the count.

Measured on an H200 (benchmarks/results/graph_capture_probe_sm_90.txt and graph_gap_probe_sm_90.txt, from
probes kept in git history; benchmarks/timer_fidelity.py):
- a replay launched on an idle device reads a 2 us add 9 % or 19 % slow (two levels that toggle a few
  times a second), the same replay queued behind another one within 3 % of the CUPTI kernel time: so every
  timed replay is queued behind an untimed *lead* replay of the same graph;
- where a capture places its outputs moves that add by up to 11 %: so each call is captured
  GRAPH_CAPTURES times and sample ``k`` replays capture ``k % GRAPH_CAPTURES``;
- tracing itself puts a 0.13-0.19 us floor gap between nodes: so, where the profiler works, only the floor
  gap of a traced queued replay beyond that tracing floor (calibrated on empty kernels) is idle the
  untraced replay pays; ``graph_idle="subtract"`` takes it off per device activity of a call (about
  0.65 us around the memset node of cuDNN attention, nothing between the add's kernels).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

from pytest_ditgate.bench.timers import Call, HostOnlyError, Sampled, Sampling, TimingError, device_spans, profiled

#: a graph replay is sized to last about this long, so the fixed cost of a replay stays below 0.5 %
GRAPH_REPLAY_MS = 5.0
GRAPH_MAX_CALLS = 10_000
#: captures per call, sampled in turn: where a capture places its outputs moves a 2 us add by up to 11 %
#: (queued replays on an H200), so with one capture per side A vs A pairs differ "significantly"
GRAPH_CAPTURES = 3
#: empty-kernel nodes of the graph that measures the floor gap tracing itself adds
TRACING_NODES = 200
_tracing_floor_ms: dict[int, float] = {}


class CaptureRefused(TimingError):
    """The call cannot be captured in a CUDA graph because it waits for the host (a synchronisation, a copy to
    the host, ``.item()``): its latency is measured by events instead."""


def _synchronises(error: BaseException) -> bool:
    text = f"{type(error).__name__}: {error}".lower()
    return any(word in text for word in ("capturing", "capture", "synchroniz", "synchronis", "not permitted",
                                         "pinned"))


def _generator_state() -> Any:
    """The current device's default CUDA generator and a clone of its state (None where this torch cannot
    clone one), taken before a capture."""
    import torch

    generator = torch.cuda.default_generators[torch.cuda.current_device()]
    try:
        return generator, generator.clone_state()
    except (AttributeError, RuntimeError):  # pragma: no cover - torch before 2.4
        return None


def _restore_generator(saved: Any) -> None:
    """After a capture that failed: the default generator back on its state from before it. A failed capture
    leaves the generator marked as capturing, and every later random draw on the device (``torch.randn``, a
    dropout) then fails with "Offset increment outside graph capture" for the rest of the process."""
    if saved is None:  # pragma: no cover - torch before 2.4
        return
    generator, state = saved
    generator.graphsafe_set_state(state)


@contextmanager
def generator_kept() -> Iterator[None]:
    """Around a CUDA graph capture (outside ``torch.cuda.graph``, so that the capture has ended): where it
    fails, the device's default generator goes back to its state from before, so that one failed capture does
    not break every later random draw of the process. Public for any capture, such as a model's own graphs."""
    saved = _generator_state()
    try:
        yield
    except BaseException:
        _restore_generator(saved)
        raise


class CapturedGraph:
    """``count`` calls captured in one CUDA graph; calls cycle through ``variants`` (rotated input copies).

    Graphs given the same ``pool`` share one memory pool, so that the graphs of a pair place their outputs
    alike. ``floor_ms`` (smallest gap between nodes beyond the tracing floor) and ``activities_per_call``
    come from a traced queued replay (0 until measured).
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
            with generator_kept(), torch.cuda.graph(self.graph, pool=pool):
                for i in range(count):
                    variants[i % len(variants)]()
        except Exception as exc:
            if _synchronises(exc):
                raise CaptureRefused(f"the call synchronises with the host, which a CUDA graph cannot capture "
                                     f"({type(exc).__name__}: {str(exc).splitlines()[0][:160]})") from exc
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


class GraphSet:
    """The captures of one call (same count, one shared pool); sample ``k`` replays capture ``k % len``."""

    def __init__(self, captures: Sequence[CapturedGraph]) -> None:
        self.captures = list(captures)
        self.count = self.captures[0].count

    def capture_for(self, sample: int) -> CapturedGraph:
        return self.captures[sample % len(self.captures)]


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


def time_graphs(sets: Sequence[GraphSet], order: Sequence[int]) -> list[list[float]]:
    """One queued replay per schedule entry, each call's captures in turn, after a few warm-up replays of
    every capture; raw samples in ms per call."""
    for graph_set in sets:
        for capture in graph_set.captures:
            for _ in range(3):
                capture.time_replay()
    raw: list[list[float]] = [[] for _ in sets]
    for index in order:
        raw[index].append(sets[index].capture_for(len(raw[index])).time_replay())
    return raw


def without_floor_gaps(sets: Sequence[GraphSet], raw: Sequence[Sequence[float]]) -> list[list[float]]:
    """Raw samples less their capture's floor gap per device activity (nothing where it was not measured)."""
    return [[value - graph_set.capture_for(k).floor_ms * graph_set.capture_for(k).activities_per_call
             for k, value in enumerate(samples)] for graph_set, samples in zip(sets, raw)]


# -- the mechanism: capture, size, time and (by default) take off the idle between nodes -----------------------

#: replays per sample: the runner's rounds, within these bounds
GRAPH_MIN_REPS, GRAPH_MAX_REPS = 10, 200


def time_graph_mechanism(calls: Sequence[Call], sampling: Sampling) -> Sampled:
    """The ``graph`` mechanism's sampler (the record in :mod:`pytest_ditgate.bench.mechanisms`)."""
    from pytest_ditgate.bench import l2 as l2mod

    cold = sampling.options.l2 == "cold"
    variant_sets = [_rotations(c, sampling.device.l2_bytes) if cold else [c] for c in calls]
    sets = capture_graphs(variant_sets)
    replay_ms = sum(2 * s.count * s.captures[0].time_replay() for s in sets)  # a lead and a timed replay
    rounds = sampling.rounds(replay_ms, GRAPH_MIN_REPS, GRAPH_MAX_REPS)
    raw = time_graphs(sets, sampling.schedule(rounds))
    idle_note = "idle between graph nodes kept (graph_idle='keep')"
    if sampling.options.graph_idle == "subtract":
        idle_note = _floor_note([c for s in sets for c in s.captures])
    samples = without_floor_gaps(sets, raw)
    counts = [s.count for s in sets]
    note = f"; {counts[0]} calls per replay, {len(sets[0].captures)} captures in turn"
    extra: dict[str, Any] = {"calls_per_replay": counts[0], "captures": len(sets[0].captures)}
    if cold:
        note += (f"; cold L2 by rotating {len(variant_sets[0])} input copies whose working set exceeds "
                 f"{l2mod.L2_FACTOR}x L2")
        extra["rotated_copies"] = len(variant_sets[0])
    extras = [dict(extra, **_gap_record(r, s)) for r, s in zip(raw, sets)]
    return Sampled(samples, counts, extras, note + "; " + idle_note)


def _rotations(call: Call, l2_bytes: int | None) -> list[Call]:
    import torch

    from pytest_ditgate.bench import l2 as l2mod

    payload = (call.args, call.kwargs)
    arg_bytes = l2mod.tensor_bytes(payload)
    try:
        free, _ = torch.cuda.mem_get_info()
    except Exception:
        free = None
    try:
        copies = l2mod.rotation_count(arg_bytes, l2_bytes, free)
    except ValueError as exc:
        raise TimingError(f"cold L2 in a graph needs rotated inputs: {exc}") from None
    variants = [call]
    for _ in range(copies - 1):
        args, kwargs = l2mod.clone_tensors(payload)
        variants.append(Call(call.fn, args, kwargs))
    return variants


#: what ``graph_idle="subtract"`` does, for the note
IDLE_DESCRIPTION = ("floor gap between graph nodes of a traced queued replay, beyond the floor tracing itself "
                    "adds (calibrated on empty kernels), subtracted per device activity of a call")


def _floor_note(captures: Sequence[Any]) -> str:
    """Measure each capture's floor gap (to be subtracted); the note says what was done or why not."""
    try:
        baseline = measure_floor_gaps(captures)
    except TimingError as exc:
        return f"idle between graph nodes not subtracted ({exc})"
    most = max(c.floor_ms * c.activities_per_call for c in captures)
    return IDLE_DESCRIPTION + f": tracing floor {baseline * 1e3:.3f} us, up to {most * 1e3:.3f} us per call"


def _gap_record(raw: list[float], graph_set: Any) -> dict[str, Any]:
    """What was subtracted from one call's graph samples (per capture), and the raw median (for ``extra``)."""
    import statistics

    captures = graph_set.captures
    if not any(c.activities_per_call for c in captures):
        return {"graph_idle": "kept", "raw_median_ms": statistics.median(raw)}
    return {"graph_idle": "subtracted", "raw_median_ms": statistics.median(raw),
            "activities_per_call": captures[0].activities_per_call,
            "floor_gap_us": [c.floor_ms * 1e3 for c in captures],
            "subtracted_per_call_us": [c.floor_ms * c.activities_per_call * 1e3 for c in captures]}
