"""Three of the four timing mechanisms (cupti, events, wall) and what they share. Each times a *schedule* of calls (one function, or A B B A interleaved).

- ``cupti``: kernel activity from the CUDA profiler (``torch.profiler``): per call, the time the device was
  busy with it (union of its kernel/memcpy/memset intervals). The span from first start to last end is
  kept too: where it is much longer, the device sat idle waiting for the host (a launch-bound call).
- ``graph``: a CUDA graph of many calls replayed and timed with events, divided by the count
  (back-to-back: the *sustained* regime); lives in :mod:`pytest_ditgate.bench.graphs`.
- ``events``: CUDA events around each call, all streams synchronised after it.
- ``wall``: host clock around each call with a device synchronisation (the only one without a GPU).

torch is imported inside the functions. A mechanism that cannot measure raises :class:`TimingError`
with a reason that ends up in ``Measurement.mechanism_notes``.
"""

from __future__ import annotations

import bisect
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

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


def time_cupti(calls: Sequence[Call], order: Sequence[int], *, flush: Callable[[], None] | None = None,
               regime: str = "spaced") -> "CuptiSamples":
    """Device busy time per call from ``torch.profiler`` kernel activity (spans in ``.spans``)."""
    import torch
    from torch.profiler import record_function

    if regime == "sustained" and (flush is not None or len(set(order)) > 1):
        raise TimingError("sustained cupti timing takes one function and warm L2 only")

    def run() -> None:
        for index in order:
            if regime == "spaced":
                _maybe(flush)
                torch.cuda.synchronize()
            with record_function(CALL_RANGE):
                calls[index]()
                if regime == "spaced":
                    torch.cuda.synchronize()

    events = profiled(run, host=True)
    cuda = torch.autograd.DeviceType.CUDA
    spans = device_spans(events, cuda)
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
