"""The samplers of four timing mechanisms (latency, events, wall, cupti) and what every sampler shares. Each
times a *schedule* of calls (one function, or A B B A interleaved); :mod:`pytest_ditgate.bench.mechanisms`
says what each counts.

- ``latency``: calls issued back to back in batches, CUDA events around each batch: per call, what a caller
  waits for, host gaps, synchronisations and launch gaps included (the *sustained* regime);
- ``events``: CUDA events around each call, all streams synchronised after it (an isolated call);
- ``wall``: host clock around each call with a device synchronisation (the only one without a GPU);
- ``cupti``: kernel activity from the CUDA profiler (``torch.profiler``): per call, the time the device was
  busy with it (union of its kernel/memcpy/memset intervals). The span from first start to last end is
  kept too: where it is much longer, the device sat idle waiting for the host (a launch-bound call).
- ``graph`` lives in :mod:`pytest_ditgate.bench.graphs`.

A sampler is called as ``sampler(calls, sampling)`` and returns :class:`Sampled`. It takes each timed call
from ``sampling.guard`` (:class:`Guard`): a pair's guard hands out the call bound to fresh copies of its
arguments before the timed window opens and sees what it returned after the window closes
(:mod:`pytest_ditgate.bench.audit`). The host clock is the genuine ``time.perf_counter`` bound when this module
loads (:func:`pytest_ditgate.timer_integrity.bind_clock`), and the module's own names are watched while timing,
so that neither a patched ``time.perf_counter`` nor a name rebound here times a call unseen. torch is imported inside
the functions. A mechanism that cannot measure raises :class:`TimingError` with a reason that ends up in
``Measurement.mechanism_notes``. :func:`trace_calls` is the diagnosis beside a latency: each call's busy time
and the host synchronisations it makes.
"""

from __future__ import annotations

import bisect
import math
import statistics
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from pytest_ditgate.timer_integrity import bind_clock, watch

#: the host clock every sampler reads, bound when this module loads
CLOCK = bind_clock(__name__, "CLOCK")

#: user annotation that brackets each timed call in the profiler trace
CALL_RANGE = "ditgate::call"


class TimingError(RuntimeError):
    """This mechanism cannot time this call here (the reason says why)."""


class HostOnlyError(TimingError):
    """The call launched no device work: only the host clock can time it."""


class CallRaised(Exception):
    """The timed function itself raised ``error`` (the user's code, not a timing mechanism): ``measure``
    reports it as that code's, never as a mechanism that failed."""

    def __init__(self, fn: Callable[..., Any], error: Exception) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.fn, self.error = fn, error
        #: the call that raised, where a guard handed it out (its fresh arguments)
        self.call: Any = None


class Guard:
    """Which call a sampler times next and what it does with the output; this one times ``calls`` as they are
    (a measurement). A pair's guard (:class:`pytest_ditgate.bench.audit.PairGuard`) binds each timed call to
    fresh copies of its arguments and audits what it returns."""

    def __init__(self, calls: Sequence["Call"]) -> None:
        self.calls = calls

    def call(self, index: int) -> "Call":
        """Call ``index`` as the next timed call: asked before the timed window opens."""
        return self.calls[index]

    def batch(self, index: int, count: int) -> list["Call"]:
        """``count`` calls of ``index`` timed back to back in one window (a latency batch)."""
        return [self.calls[index]] * count

    def returned(self, index: int, call: "Call", output: Any) -> None:
        """The timed ``call`` of ``index`` returned ``output``: told after the timed window closed."""

    def prepare(self) -> None:
        """Before the warm-up."""

    def plan(self, rounds: int) -> None:
        """``rounds`` rounds of the calls will be timed."""

    def finish(self) -> dict[str, Any]:
        """After timing (and the timer checks): what the guard did, for the first call's ``extra``."""
        return {}

    def close(self) -> None:
        """When the measurement ends, whether it succeeded or not."""

    def retry(self, raised: CallRaised) -> bool:
        """Whether to warm up and time again after a timed function raised (the guard changed what it hands
        out); False: the exception is the function's."""
        return False


@dataclass
class Sampling:
    """What a sampler is given besides the calls: each call's host-clock estimate (an upper bound, its sync
    included), the L2 flush to run before a call (None: warm), the regime, the device, the measurement's
    options, the rounds and schedule helpers of the runner, and the guard that hands out each timed call."""

    estimates: Sequence[float]
    flush: Callable[[], None] | None
    regime: str
    device: Any
    options: Any
    rounds: Callable[[float, int, int], int]
    schedule: Callable[[int], list[int]]
    guard: Guard | None = None

    def guarded(self, calls: Sequence["Call"]) -> Guard:
        return self.guard if self.guard is not None else Guard(calls)


@dataclass
class Sampled:
    """One list of milliseconds per call, the calls each sample averages, details per call and a note."""

    samples: list[list[float]]
    calls_per_sample: list[int]
    extras: list[dict[str, Any]]
    note: str = ""


#: the per-sample bounds of the runner (a sample per call or per batch)
MIN_REPS, MAX_REPS = 10, 1000
#: a latency batch lasts about this long, so that the start of a batch on an idle device (one launch) stays
#: under about 1 % of it
LATENCY_BATCH_MS = 2.0
LATENCY_MAX_BATCH = 1000


@dataclass
class Call:
    """A function bound to its arguments; an exception it raises comes out as :class:`CallRaised`."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __call__(self) -> Any:
        try:
            return self.fn(*self.args, **self.kwargs)
        except CallRaised:
            raise
        except Exception as exc:
            raise CallRaised(self.fn, exc) from None


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


def holds_cuda_tensor(value: Any, depth: int = 0) -> bool:
    """True when ``value`` is or holds a CUDA tensor: in a list, tuple, set, dict or an object's attributes (a
    model output), or a module's parameters or buffers; a few levels deep, the first entries of each."""
    if depth > 4:
        return False
    is_cuda = getattr(value, "is_cuda", None)
    if isinstance(is_cuda, bool) and hasattr(value, "device"):
        return is_cuda
    if isinstance(value, (str, bytes, int, float, bool, type(None))):
        return False
    if isinstance(value, dict):
        return any(holds_cuda_tensor(v, depth + 1) for v in list(value.values())[:32])
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(holds_cuda_tensor(v, depth + 1) for v in list(value)[:32])
    parameters, buffers = getattr(value, "parameters", None), getattr(value, "buffers", None)
    if callable(parameters) and callable(buffers):  # an nn.Module: where its weights live
        try:
            return any(holds_cuda_tensor(t, depth + 1) for t in [*parameters(), *buffers()][:8])
        except Exception:  # noqa: BLE001 - not a module after all
            return False
    owner = getattr(value, "__self__", None)  # a bound method: its object
    if owner is not None and not isinstance(owner, type):
        return holds_cuda_tensor(owner, depth + 1)
    cells = getattr(value, "__closure__", None)  # a closure: what it captured
    if isinstance(cells, tuple):
        captured = []
        for cell in cells[:32]:
            try:
                captured.append(cell.cell_contents)
            except ValueError:  # an empty cell
                continue
        return holds_cuda_tensor(captured, depth + 1)
    if callable(getattr(value, "func", None)) and isinstance(getattr(value, "args", None), tuple):  # a partial
        return holds_cuda_tensor((value.func, value.args, getattr(value, "keywords", None) or {}), depth + 1)
    attributes = getattr(value, "__dict__", None)
    if isinstance(attributes, dict) and not callable(value):
        return any(holds_cuda_tensor(v, depth + 1) for v in list(attributes.values())[:32])
    return False


def synchronize() -> None:
    """Wait for every stream of the current device (a no-op without CUDA)."""
    if cuda_in_use():
        import torch

        torch.cuda.synchronize()


def _maybe(flush: Callable[[], None] | None) -> None:
    if flush is not None:
        flush()


def _per_call(calls: Sequence[Call], sampling: Sampling, per_sample_ms: float) -> list[int]:
    return sampling.schedule(sampling.rounds(per_sample_ms, MIN_REPS, MAX_REPS))


def _single(samples: list[list[float]], note: str = "") -> Sampled:
    return Sampled(samples, [1] * len(samples), [{} for _ in samples], note)


def time_wall(calls: Sequence[Call], sampling: Sampling) -> Sampled:
    """Host clock around each call, with a device synchronisation before and after."""
    order = _per_call(calls, sampling, max(sampling.estimates) * len(calls))
    samples: list[list[float]] = [[] for _ in calls]
    guard = sampling.guarded(calls)
    clock = CLOCK
    for index in order:
        call = guard.call(index)
        _maybe(sampling.flush)
        synchronize()
        start = clock()
        output = call()
        synchronize()
        samples[index].append((clock() - start) * 1e3)
        guard.returned(index, call, output)
        del output, call  # freed outside every timed window
    return _single(samples)


def time_events(calls: Sequence[Call], sampling: Sampling) -> Sampled:
    """CUDA events on the current stream around each call; the device is synchronised after each one."""
    import torch

    order = _per_call(calls, sampling, max(sampling.estimates) * len(calls))
    guard = sampling.guarded(calls)
    pending = []
    for index in order:
        call = guard.call(index)
        _maybe(sampling.flush)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        output = call()
        end.record()
        torch.cuda.synchronize()
        pending.append((index, start, end))
        guard.returned(index, call, output)
        del output, call
    samples: list[list[float]] = [[] for _ in calls]
    for index, start, end in pending:
        samples[index].append(float(start.elapsed_time(end)))
    return _single(samples)


def latency_batch(estimate_ms: float) -> int:
    """Calls per latency sample: about LATENCY_BATCH_MS of them by the host-clock estimate (which includes a
    synchronisation, so the batch runs somewhat shorter)."""
    if not estimate_ms > 0:
        return LATENCY_MAX_BATCH
    return int(max(1, min(LATENCY_MAX_BATCH, math.ceil(LATENCY_BATCH_MS / estimate_ms))))


def time_latency(calls: Sequence[Call], sampling: Sampling) -> Sampled:
    """Per call, what a caller waits for when calls follow each other: batches of calls issued back to back,
    CUDA events around each batch, the batch's time divided by its calls. One synchronisation per round (a
    batch of each call), none inside: a call that is device-bound keeps the queue full, so its time is the
    device's; a call that waits for the host (a synchronisation, host work, launch gaps) leaves the device
    idle, and that idle is counted. With a cold L2 every sample is one call, the flush queued before its
    start event."""
    import torch

    cold = sampling.flush is not None
    batches = [1 if cold else latency_batch(e) for e in sampling.estimates]
    per_round = sum(e * b for e, b in zip(sampling.estimates, batches))
    order = sampling.schedule(sampling.rounds(per_round, MIN_REPS, MAX_REPS))
    guard = sampling.guarded(calls)
    pending = []
    torch.cuda.synchronize()
    for position, index in enumerate(order):
        batch = guard.batch(index, batches[index])
        _maybe(sampling.flush)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for call in batch:
            output = call()
        end.record()
        pending.append((index, start, end))
        guard.returned(index, batch[-1], output)
        del output, call, batch
        if (position + 1) % len(calls) == 0:  # a round: every call once
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    samples: list[list[float]] = [[] for _ in calls]
    for index, start, end in pending:
        samples[index].append(float(start.elapsed_time(end)) / batches[index])
    extras = [{"calls_per_batch": b} for b in batches]
    note = (f"; {', '.join(str(b) for b in batches)} call(s) per batch" if not cold
            else "; one call per sample, the L2 flush queued before its start event")
    return Sampled(samples, batches, extras, note)


def device_spans(events: Sequence[Any], device_type: Any) -> list[tuple[int, int]]:
    """(start, end) ns of the device activities in a profiler trace, in start order (annotations left out)."""
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


def profiled(run: Callable[[], None], *, host: bool = False, device: bool = True, flops: bool = False,
             export: Any = None) -> list[Any]:
    """The profiler events of ``run()`` (device activity, plus host ranges with ``host``), every stream
    synchronised before the trace closes; TimingError when the profiler cannot trace here.

    ``device=False`` traces host ops only (no CUDA); ``flops`` asks torch for its FLOP counts (and so the
    input shapes); ``export`` is a path the Chrome/Perfetto trace is written to (OSError if it cannot be).
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] if host or not device else []
    if device:
        activities.append(ProfilerActivity.CUDA)
    options = {"with_flops": True, "record_shapes": True} if flops else {}
    raised: list[Exception] = []
    try:
        with warnings.catch_warnings():  # torch warns on entering the profiler that it clears old events
            warnings.filterwarnings("ignore", message=".*Profiler clears events")
            with profile(activities=activities, **options) as prof:
                try:
                    run()
                except Exception as exc:  # the timed code's own error, not the profiler's: raised below
                    raised.append(exc)
                else:
                    if device:
                        torch.cuda.synchronize()
            events = None if raised else prof.profiler.kineto_results.events()
    except Exception as exc:  # profiler busy (another profile running), CUPTI missing, ...
        raise TimingError(f"profiler unavailable: {type(exc).__name__}: {exc}") from exc
    if raised:
        raise raised[0]
    if export is not None:
        prof.export_chrome_trace(str(export))
    return events


def time_cupti(calls: Sequence[Call], sampling: Sampling) -> Sampled:
    """Device busy time per call from ``torch.profiler`` kernel activity; each call's span (first start to last
    end) and the idle fraction of its span go into the extras."""
    order = _per_call(calls, sampling, max(sampling.estimates) * len(calls))
    found = cupti_samples(calls, order, flush=sampling.flush, regime=sampling.regime, guard=sampling.guard)
    extras = []
    for busy, spans in zip(found, found.spans):
        span = statistics.median(spans)
        extras.append({"span_median_ms": span, "idle_fraction": max(0.0, 1.0 - statistics.median(busy) / span)})
    return Sampled(list(found), [1] * len(calls), extras)


def cupti_samples(calls: Sequence[Call], order: Sequence[int], *, flush: Callable[[], None] | None = None,
                  regime: str = "spaced", guard: Guard | None = None) -> "CuptiSamples":
    """Device busy time per call from ``torch.profiler`` kernel activity (spans in ``.spans``)."""
    import torch
    from torch.profiler import record_function

    if regime == "sustained" and (flush is not None or len(set(order)) > 1):
        raise TimingError("sustained cupti timing takes one function and warm L2 only")
    guard = guard if guard is not None else Guard(calls)

    def run() -> None:
        for index in order:
            call = guard.call(index)
            if regime == "spaced":
                _maybe(flush)
                torch.cuda.synchronize()
            with record_function(CALL_RANGE):
                output = call()
                if regime == "spaced":
                    torch.cuda.synchronize()
            guard.returned(index, call, output)
            del output, call

    events = profiled(run, host=True)
    cuda = torch.autograd.DeviceType.CUDA
    spans = device_spans(events, cuda)
    if regime == "spaced":
        ranges = sorted((int(e.start_ns()), int(e.end_ns())) for e in events
                        if e.name() == CALL_RANGE and e.device_type() != cuda)
        if len(ranges) != len(order):
            raise TimingError(f"found {len(ranges)} call ranges in the trace for {len(order)} calls")
        groups = assign_spans(ranges, spans)  # a guard's copies run outside the ranges: they are left out
        if not any(groups):
            raise HostOnlyError("the profiler recorded no device activity for the call")
    elif not spans:
        raise HostOnlyError("the profiler recorded no device activity for the call")
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


# -- the diagnosis beside a latency: busy time and host synchronisations per call ---------------------------

#: the user annotation around the timed function itself inside a traced call (its own synchronisations only)
FN_RANGE = "ditgate::fn"
#: CUDA runtime and driver calls that make the host wait for the device
SYNC_CALLS = frozenset({
    "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cudaMemcpy2D",
    "cudaMemcpyFromSymbol", "cudaMemcpyDtoH", "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize",
    "cuMemcpyDtoH", "cuMemcpyDtoH_v2", "cuMemcpy", "cuMemcpy_v2",
})
#: a trace with none of these holds no runtime activity, so synchronisations cannot be counted from it
LAUNCH_CALLS = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                          "cudaMemcpyAsync", "cudaMemsetAsync", "cudaGraphLaunch"})


@dataclass(frozen=True)
class Activity:
    """One event of a trace: its name, whether it ran on the device, its start and end (ns), and whether it is
    a user annotation (a range)."""

    name: str
    on_device: bool
    start: int
    end: int
    annotation: bool = False


def activities(events: Sequence[Any], device_type: Any) -> list[Activity]:
    """The profiler's events as :class:`Activity` records."""
    out = []
    for event in events:
        name = event.name()
        annotation = name.startswith("ditgate::") or event.is_user_annotation()
        out.append(Activity(name, event.device_type() == device_type, int(event.start_ns()), int(event.end_ns()),
                            annotation))
    return out


def summarize_calls(found: Sequence[Activity], order: Sequence[int], n_calls: int) -> list[dict[str, Any]]:
    """Per call of a traced spaced run (each call inside a ``ditgate::call`` range holding a ``ditgate::fn``
    range around the function, the device synchronised before the outer range ends): the median time the
    device was busy with it, and the host synchronisations its function made (runtime calls that wait for
    the device, such as ``.item()``'s). ``host_syncs`` is None when the trace holds no runtime activity."""
    outer = sorted((a.start, a.end) for a in found if a.name == CALL_RANGE and not a.on_device)
    inner = sorted((a.start, a.end) for a in found if a.name == FN_RANGE and not a.on_device)
    if len(outer) != len(order) or len(inner) != len(order):
        raise TimingError(f"found {len(outer)} call ranges in the trace for {len(order)} calls")
    spans = sorted((a.start, a.end) for a in found if a.on_device and not a.annotation)
    groups = assign_spans(outer, spans)
    runtime = [a for a in found if not a.on_device and not a.annotation and a.name in SYNC_CALLS | LAUNCH_CALLS]
    syncs = [a for a in runtime if a.name in SYNC_CALLS]
    launched = [a for a in runtime if a.name in LAUNCH_CALLS]
    busy: list[list[float]] = [[] for _ in range(n_calls)]
    counts: list[list[int]] = [[] for _ in range(n_calls)]
    launches: list[list[int]] = [[] for _ in range(n_calls)]
    names: list[set[str]] = [set() for _ in range(n_calls)]
    for index, group, (start, end) in zip(order, groups, inner):
        busy[index].append(busy_ns(group) / 1e6 if group else 0.0)
        mine = [a for a in syncs if start <= a.start and a.end <= end]
        counts[index].append(len(mine))
        launches[index].append(sum(start <= a.start and a.end <= end for a in launched))
        names[index].update(a.name for a in mine)
    out = []
    for index in range(n_calls):
        entry: dict[str, Any] = {"busy_median_ms": statistics.median(busy[index]) if busy[index] else None}
        if runtime:
            entry["host_syncs"] = int(statistics.median(counts[index])) if counts[index] else 0
            entry["sync_calls"] = sorted(names[index])
        else:
            entry["host_syncs"] = None
        entry["launches"] = max(launches[index], default=0) if runtime else None
        out.append(entry)
    return out


def runs_on_host(traced: Sequence[dict[str, Any]]) -> bool:
    """True when a traced run (:func:`trace_calls`) shows that no call did device work: no device activity and,
    where the trace holds the runtime's calls, no launch, copy or memset. Such a call's time is the host's."""
    return bool(traced) and all(entry.get("busy_median_ms") == 0 and entry.get("launches") in (0, None)
                                for entry in traced)


def trace_calls(calls: Sequence[Call], per_call: int = 3) -> list[dict[str, Any]]:
    """Trace each call ``per_call`` times, spaced, and summarise it (:func:`summarize_calls`)."""
    import torch
    from torch.profiler import record_function

    order = [index for _ in range(per_call) for index in range(len(calls))]

    def run() -> None:
        for index in order:
            torch.cuda.synchronize()
            with record_function(CALL_RANGE):
                with record_function(FN_RANGE):
                    calls[index]()
                torch.cuda.synchronize()

    events = profiled(run, host=True)
    return summarize_calls(activities(events, torch.autograd.DeviceType.CUDA), order, len(calls))


watch(__name__)
