"""Phase profiles: one traced call, summarised as time per phase, the top kernels and their achieved rates.

Pure Python over a Chrome/Perfetto trace as ``torch.profiler`` exports it (``traceEvents``), plus the
FLOP counts torch attached to its ops (keyed by the op's ``External id``). Two sources:

- ``device``: the trace holds device activity (``kernel``, ``gpu_memcpy``, ``gpu_memset``). The phase
  times split the device's busy time (kernels overlapping on several streams share the overlap equally);
  ``idle`` is the time between the first kernel's start and the last one's end when none ran.
- ``host``: no device activity (a CPU run): the host ops inside the profiled call (``ditgate::profile``),
  each owning its *self* time (time in a child op is the child's); ``idle`` is host time in the call
  outside any op (Python, the interpreter).

Given the timed (untraced) median, idle is also read against it: ``max(0, timed - busy) / timed``, since
tracing inflates the host's launch gaps. A CUDA graph replay launches its kernels without ops, so they carry
no FLOPs or bytes; given a trace of the same computation run eagerly, :func:`credit_from_eager` lends them
the amounts of the eager run's kernels, matched by launch order (or by name where that is unambiguous).
Rates are never invented: TFLOP/s where torch reported FLOPs for the op that launched the kernel, GB/s
where the bytes are known (memcpy/memset from the trace, kernels from their op's recorded shapes,
:mod:`pytest_ditgate.bench.traffic`), and either where a ``rated`` range names them for a launch torch
counts nothing for (:mod:`pytest_ditgate.bench.rated`); compute phases are judged in TFLOP/s, memory-bound
ones in GB/s (rules in docs/profiling.md). Peaks come from the device profile.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Any, Callable, Iterable, Mapping

from pytest_ditgate.bench.phases import PHASES, classify
from pytest_ditgate.bench.rated import parse_range
from pytest_ditgate.bench.traffic import op_bytes
from pytest_ditgate.numbers import finite_number

#: folder under the artefact folder that holds the traces
PROFILE_DIR = "profiles"
#: user range around the profiled call in the trace
WINDOW = "ditgate::profile"
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
HOST_CATEGORY = "cpu_op"
TOP_KERNELS = 10
NAME_LIMIT = 300
SCHEMA = 1
#: phases judged by bytes moved (GB/s against the copy-bandwidth peak), not by FLOPs
MEMORY_PHASES = frozenset({"elementwise", "copy"})
#: a compute kernel below this fraction of the FLOP peak is shown in GB/s too (where its bytes are known)
TINY_FLOP_FRACTION = 0.05
NO_OP = "no launching op in the trace (a CUDA graph replay has none)"
NO_SHAPES = "its launching op recorded no sized tensor inputs"
NOT_LONGEST = "its op's bytes are credited to the op's longest kernel"
COMPOSITE = "a composite op: its child ops move the bytes"


@dataclass
class Activity:
    """One kernel, copy or host op: its self spans (ns), the op that launched it and what it moved or computed."""

    name: str
    spans: tuple[tuple[int, int], ...]
    op: int | None = None
    #: bytes read + written in device memory (a DtoD copy counts twice); None: unknown, see ``bytes_why``
    bytes: int | None = None
    flops: int | None = None
    dtype: str | None = None
    bytes_why: str | None = None
    #: a transfer over a link (HtoD, DtoH, PtoP): its GB/s has no peak here
    link: bool = False
    #: the device stream it ran on (None: not recorded)
    stream: int | None = None

    @property
    def duration_ns(self) -> int:
        return sum(end - start for start, end in self.spans)

    @property
    def phase(self) -> str:
        return classify(self.name)


def _ns(value: Any) -> int | None:
    """A trace timestamp (microseconds, float) in integer nanoseconds; None when it is not a number."""
    return int(round(value * 1000)) if finite_number(value) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _timed(event: Mapping[str, Any]) -> tuple[int, int] | None:
    start, duration = _ns(event.get("ts")), _ns(event.get("dur"))
    if start is None or duration is None or duration < 0:
        return None
    return start, start + duration


def activities_from_trace(trace: Mapping[str, Any], flops: Mapping[int, tuple[int, str | None]] | None = None
                          ) -> tuple[str, list[Activity], tuple[int, int] | None]:
    """(source, activities, window): device activity when the trace has any, else the host ops of the
    ``ditgate::profile`` range; ``("none", [], window)`` when neither is there."""
    events = [e for e in trace.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X"]
    flops = flops or {}
    window_event = next((e for e in events if e.get("name") == WINDOW and e.get("cat") != "gpu_user_annotation"), None)
    window = _timed(window_event) if window_event else None
    device = []
    for event in events:
        if str(event.get("cat", "")).lower() in DEVICE_CATEGORIES and (span := _timed(event)) is not None:
            args = _args(event)
            name = str(event.get("name", "?"))
            moved, comparable = _copy_traffic(name, _int(args.get("bytes")))
            device.append(Activity(name, (span,), op=_int(args.get("External id")), bytes=moved,
                                   link=moved is not None and not comparable, stream=_int(args.get("stream"))))
    if device:
        _credit_flops(device, flops)
        _credit_bytes(device, _op_traffic(events))
        _credit_rated(device, _rated_ranges(events))
        return "device", device, window
    if window is None:
        return "none", [], None
    thread = window_event.get("tid")
    ops = []
    for event in events:
        span = _timed(event)
        if (event.get("cat") == HOST_CATEGORY and event.get("tid") == thread and span is not None
                and window[0] <= span[0] and span[1] <= window[1]):
            ops.append((span, str(event.get("name", "?")), _args(event)))
    if not ops:
        return "none", [], window
    activities = []
    for (span, name, args), spans in zip(ops, self_spans([span for span, _, _ in ops])):
        op = _int(args.get("External id"))
        count, dtype = flops.get(op, (None, None)) if op is not None else (None, None)
        # an op that spends most of its time in child ops (aten::linear -> aten::addmm) leaves the bytes to them
        worker = 2 * sum(end - start for start, end in spans) >= span[1] - span[0]
        moved = op_bytes(name, args) if worker else None
        activities.append(Activity(name, tuple(spans), op=op, flops=count or None, dtype=dtype, bytes=moved,
                                   bytes_why=None if moved is not None else NO_SHAPES if worker else COMPOSITE))
    return "host", activities, window


def _args(event: Mapping[str, Any]) -> Mapping[str, Any]:
    return event.get("args") if isinstance(event.get("args"), dict) else {}


RATED_NO_BYTES = "its rated range gave FLOPs, no bytes"


def _rated_ranges(events: list[dict[str, Any]]) -> list[tuple[tuple[int, int], dict[str, Any]]]:
    """The device-side spans of ``rated`` ranges (``gpu_user_annotation``: the profiler spans each over the
    kernels launched inside it) and their amounts, innermost (shortest) first."""
    ranges = []
    for event in events:
        if event.get("cat") == "gpu_user_annotation" and (span := _timed(event)) is not None:
            amounts = parse_range(str(event.get("name", "")))
            if amounts is not None:
                ranges.append((span, amounts))
    return sorted(ranges, key=lambda r: r[0][1] - r[0][0])


def _credit_rated(activities: list[Activity], ranges: list[tuple[tuple[int, int], dict[str, Any]]]) -> None:
    """A ``rated`` range's FLOPs go to the longest kernel inside its span that has none of its own, and its
    bytes likewise: torch counts neither for a launch its own ops did not make (a DSL GEMM, a custom op, a
    raw Triton kernel), whatever op launched it."""
    for (start, end), amounts in ranges:
        inside = [a for a in activities if start <= a.spans[0][0] and a.spans[-1][1] <= end]
        if amounts["flops"] and (wanting := [a for a in inside if not a.flops]):
            longest = max(wanting, key=lambda a: a.duration_ns)
            longest.flops, longest.dtype = amounts["flops"], amounts["dtype"]
            if amounts["bytes"] is None and longest.bytes is None:
                longest.bytes_why = RATED_NO_BYTES
        if amounts["bytes"] is not None and (wanting := [a for a in inside if a.bytes is None]):
            longest = max(wanting, key=lambda a: a.duration_ns)
            longest.bytes, longest.bytes_why = amounts["bytes"], None


def _op_traffic(events: list[dict[str, Any]]) -> dict[int, int | None]:
    """op id (``External id``) -> its estimated bytes, for the host ops of the trace."""
    traffic: dict[int, int | None] = {}
    for event in events:
        if event.get("cat") == HOST_CATEGORY and (op := _int(_args(event).get("External id"))) is not None:
            traffic[op] = op_bytes(str(event.get("name", "")), _args(event))
    return traffic


def _launched_by_op(activities: list[Activity], credited: Callable[[Activity], bool]) -> dict[int, list[Activity]]:
    """The ``credited`` activities grouped by the op that launched them, the longest first."""
    by_op: dict[int, list[Activity]] = defaultdict(list)
    for activity in activities:
        if credited(activity):
            by_op[activity.op].append(activity)
    return {op: sorted(launched, key=lambda a: a.duration_ns, reverse=True) for op, launched in by_op.items()}


def _credit_bytes(activities: list[Activity], traffic: Mapping[int, int | None]) -> None:
    """Each op's estimated bytes go to the longest kernel it launched (copies keep the trace's bytes)."""
    def credited(activity: Activity) -> bool:
        if activity.bytes is not None:
            return False
        if activity.op is None:
            activity.bytes_why = NO_OP
        elif traffic.get(activity.op) is None:
            activity.bytes_why = NO_SHAPES
        return activity.op is not None and traffic.get(activity.op) is not None

    for op, (longest, *others) in _launched_by_op(activities, credited).items():
        longest.bytes = traffic[op]
        for activity in others:
            activity.bytes_why = NOT_LONGEST


def _credit_flops(activities: list[Activity], flops: Mapping[int, tuple[int, str | None]]) -> None:
    """Each op's FLOPs go to the longest device activity it launched (a split-K reduce gets none)."""
    for op, (longest, *_) in _launched_by_op(activities, lambda a: a.op is not None and a.op in flops).items():
        count, dtype = flops[op]
        if count and count > 0:
            longest.flops, longest.dtype = int(count), dtype


NO_OP_EAGER = "launched by no op in the eager run either (a library's own launch: no FLOPs or bytes to lend)"


def _amounts(activity: Activity) -> tuple[Any, ...]:
    return activity.flops, activity.dtype, activity.bytes, activity.link


def _wanting(activity: Activity) -> bool:
    """A kernel no op launched and that carries neither FLOPs nor bytes of its own (a copy or memset keeps
    the bytes the trace gives it)."""
    return activity.op is None and activity.flops is None and activity.bytes is None


def _lend(wanting: Activity, source: Activity) -> bool:
    """Give ``wanting`` the FLOPs and bytes of ``source`` (the same kernel, run eagerly); where the eager
    kernel's bytes are unknown too, its reason replaces "no launching op". True when anything was lent."""
    lent = False
    if source.flops:
        wanting.flops, wanting.dtype, lent = source.flops, source.dtype, True
    if source.bytes is not None:
        wanting.bytes, wanting.link, wanting.bytes_why, lent = source.bytes, source.link, None, True
    elif source.bytes_why:
        wanting.bytes_why = NO_OP_EAGER if source.bytes_why == NO_OP else f"{source.bytes_why} (in the eager run)"
    return lent


def credit_from_eager(activities: list[Activity], eager: list[Activity]) -> str | None:
    """Lend the kernels that no op launched and that carry no amounts (a CUDA graph replay's) the FLOPs and
    bytes of the same kernels in ``eager``, a traced run of the same computation without the graph.

    On one stream each, kernels are matched by launch order: the longest common runs of names over every
    op-less activity (memsets and copies included, so they anchor the order; extra kernels on either side
    do not shift the rest; of equal runs the earliest eager one is taken). A kernel left unmatched, and
    every kernel when either run used several streams (start order then interleaves them), takes the
    amounts of its name only where every eager launch of that name has the same ones. Returns a note with
    the counts, or None when no kernel wanted amounts."""
    wanting = [a for a in activities if _wanting(a)]
    if not wanting:
        return None
    ordered = sorted((a for a in activities if a.op is None), key=lambda a: a.spans[0][0])
    source = sorted(eager, key=lambda a: a.spans[0][0])
    streams = len({a.stream for a in ordered}) > 1 or len({a.stream for a in source}) > 1
    matched: set[int] = set()
    by_order = 0
    if not streams:
        matcher = SequenceMatcher(None, [a.name for a in ordered], [a.name for a in source], autojunk=False)
        for block in matcher.get_matching_blocks():
            for offset in range(block.size):
                activity = ordered[block.a + offset]
                if _wanting(activity):
                    matched.add(id(activity))
                    by_order += _lend(activity, source[block.b + offset])
    amounts: dict[str, set[tuple[Any, ...]]] = defaultdict(set)
    first: dict[str, Activity] = {}
    for activity in source:
        amounts[activity.name].add(_amounts(activity))
        first.setdefault(activity.name, activity)
    by_name = sum(_lend(activity, first[activity.name]) for activity in wanting
                  if id(activity) not in matched and len(amounts.get(activity.name, ())) == 1)
    left = sum(_wanting(activity) for activity in wanting)
    how = ("several streams, so by name only" if streams else
           f"{by_order} lent by launch order, {len(matched) - by_order} matched in order to eager kernels "
           "without amounts")
    return (f"{len(wanting)} kernels without a launching op or amounts of their own (a CUDA graph replay's), "
            f"against the eager run: {how}, {by_name} lent by name; {left} left without amounts")


def self_spans(spans: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """For nested intervals on one thread (ops inside ops), the spans each one runs *itself*, children
    excluded; a child reaching past its parent is cut at the parent's end."""
    order = sorted(range(len(spans)), key=lambda i: (spans[i][0], -spans[i][1]))
    own: list[list[tuple[int, int]]] = [[] for _ in spans]
    stack: list[tuple[int, int]] = []  # (end, index)
    cursor = 0

    def close_until(time: int) -> None:
        nonlocal cursor
        while stack and stack[-1][0] <= time:
            end, index = stack.pop()
            if end > cursor:
                own[index].append((cursor, end))
            cursor = max(cursor, end)

    for index in order:
        start, end = spans[index]
        close_until(start)
        if stack:
            parent_end, parent = stack[-1]
            if start > cursor:
                own[parent].append((cursor, start))
            end = min(end, parent_end)
        stack.append((end, index))
        cursor = start
    close_until(math.inf)  # type: ignore[arg-type]
    return own


def shared_time(activities: list[Activity]) -> tuple[list[float], int]:
    """Per activity, its share of the busy time (overlaps split equally among those running), and the busy
    time (the union of all spans), both in ns."""
    points = []
    for index, activity in enumerate(activities):
        for start, end in activity.spans:
            if end > start:
                points += [(start, 1, index), (end, 0, index)]
    points.sort()
    shares = [0.0] * len(activities)
    active: dict[int, int] = {}
    busy, last = 0, None
    for time, starting, index in points:
        if active and last is not None and time > last:
            piece = (time - last) / len(active)
            for running in active:
                shares[running] += piece
            busy += time - last
        last = time
        if starting:
            active[index] = active.get(index, 0) + 1
        elif active.get(index, 0) <= 1:
            active.pop(index, None)
        else:
            active[index] -= 1
    return shares, busy


@dataclass(frozen=True)
class PhaseProfile:
    """The phase split and top kernels of one traced call: JSON-ready, survives a ledger round trip."""

    label: str
    source: str
    span_ms: float = 0.0
    busy_ms: float = 0.0
    #: phase -> {"ms", "share" (of the traced span), "count"}; every phase of PHASES, idle included
    phases: dict[str, dict[str, float]] = field(default_factory=dict)
    #: the top kernels (or host ops) by time: name, phase, count, ms, ``bound`` and rates where known
    kernels: list[dict[str, Any]] = field(default_factory=list)
    #: GEMM phase: FLOPs torch reported, their TFLOP/s over those kernels' time, coverage, peak fraction
    gemm: dict[str, Any] = field(default_factory=dict)
    #: memory-bound phases: bytes known, their GB/s over those kernels' time, coverage, peak fraction
    memory: dict[str, Any] = field(default_factory=dict)
    #: the measurement's timed (untraced) median, and idle read against it: {"ms", "share"}
    timed_ms: float | None = None
    timed_idle: dict[str, float] = field(default_factory=dict)
    activities: int = 0
    trace: str | None = None
    peaks: dict[str, Any] | None = None
    notes: tuple[str, ...] = ()
    device: str = "cpu"
    arch: str = "cpu"

    def to_dict(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data.update(schema=SCHEMA, phases={k: dict(v) for k, v in self.phases.items()},
                    kernels=[dict(k) for k in self.kernels], notes=list(self.notes))
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PhaseProfile":
        names = set(cls.__dataclass_fields__)
        kwargs = {k: v for k, v in data.items() if k in names}
        kwargs["notes"] = tuple(kwargs.get("notes", ()))
        return cls(**kwargs)


def _rate(amount: float, ns: int, unit: float) -> float | None:
    return amount / ns / unit if ns > 0 else None


def _copy_traffic(name: str, moved: int | None) -> tuple[int | None, bool]:
    """(bytes through device memory, comparable with the copy-bandwidth peak?) of a memcpy/memset: a
    device-to-device copy reads and writes each byte, a memset writes it; transfers over a link
    (HtoD, DtoH, PtoP) are counted once and have no peak here."""
    if moved is None:
        return None, False
    upper = name.upper()
    if "DTOD" in upper:
        return 2 * moved, True
    if "MEMSET" in upper:
        return moved, True
    return moved, False


def _unknown_bytes(members: list[Activity]) -> str:
    known = sum(a.bytes is not None for a in members)
    if known:
        return f"bytes known for {known} of {len(members)} launches"
    reasons = [a.bytes_why for a in members if a.bytes_why]
    return max(set(reasons), key=reasons.count) if reasons else NO_SHAPES


def _kernel_row(name: str, members: list[Activity], peaks: Mapping[str, Any]) -> dict[str, Any]:
    """One top-kernel row: TFLOP/s against the compute peak for compute phases, GB/s against the copy
    peak for memory-bound ones (and for a compute kernel at a tiny fraction of its FLOP peak)."""
    ns = sum(a.duration_ns for a in members)
    phase = members[0].phase
    row: dict[str, Any] = {"name": name[:NAME_LIMIT], "phase": phase, "count": len(members), "ms": ns / 1e6}
    if ns <= 0:
        return row
    if all(a.flops for a in members):
        row["flops"] = sum(int(a.flops or 0) for a in members)
        row["tflops"] = _rate(row["flops"], ns, 1e3)
        dtypes = {a.dtype for a in members}
        if len(dtypes) == 1 and (dtype := dtypes.pop()) is not None:
            row["dtype"] = dtype
            if dtype in (peaks.get("tflops") or {}):
                row["tflops_fraction"] = row["tflops"] / float(peaks["tflops"][dtype])
    if all(a.bytes is not None for a in members):
        row["bytes"] = sum(int(a.bytes or 0) for a in members)
        row["gbps"] = _rate(row["bytes"], ns, 1.0)
        if peaks.get("gbps") and not any(a.link for a in members):
            row["gbps_fraction"] = row["gbps"] / float(peaks["gbps"])
    tiny = row.get("tflops_fraction", 1.0) < TINY_FLOP_FRACTION
    memory = phase in MEMORY_PHASES or ("gbps" in row and (tiny or (phase == "other" and "tflops" not in row)))
    row["bound"] = "memory" if memory else "compute"
    if memory and "gbps" not in row:
        row["bytes_unknown"] = _unknown_bytes(members)
    return row


def _kernel_rows(activities: list[Activity], peaks: Mapping[str, Any] | None, top: int) -> list[dict[str, Any]]:
    groups: dict[str, list[Activity]] = defaultdict(list)
    for activity in activities:
        groups[activity.name].append(activity)
    rows = [_kernel_row(name, members, peaks or {}) for name, members in groups.items()]
    rows.sort(key=lambda r: -r["ms"])
    return rows[:top]


def _phase_rate(activities: list[Activity], phases: frozenset[str], amount: str, unit: float,
                peak: float | None) -> dict[str, Any]:
    """Over the kernels of ``phases`` whose ``amount`` (flops/bytes) is known: the total, its rate per
    ``unit``, the fraction of the phases' time they cover and of ``peak``; {} when none is known."""
    members = [a for a in activities if a.phase in phases]
    total = sum(a.duration_ns for a in members)
    counted = [a for a in members if getattr(a, amount)]
    if not total or not counted:
        return {}
    ns = sum(a.duration_ns for a in counted)
    summed = sum(int(getattr(a, amount) or 0) for a in counted)
    summary: dict[str, Any] = {amount: summed, "rate": _rate(summed, ns, unit), "coverage": ns / total}
    if peak and summary["rate"] is not None:
        summary["peak_fraction"] = summary["rate"] / float(peak)
    return summary


def _gemm_summary(activities: list[Activity], peaks: Mapping[str, Any] | None) -> dict[str, Any]:
    counted = {a.dtype for a in activities if a.phase == "gemm" and a.flops}
    dtype = next(iter(counted)) if len(counted) == 1 else None
    peak = ((peaks or {}).get("tflops") or {}).get(dtype) if dtype else None
    summary = _phase_rate(activities, frozenset({"gemm"}), "flops", 1e3, peak)
    if summary:
        summary["tflops"] = summary.pop("rate")
        if "peak_fraction" in summary:
            summary["dtype"] = dtype
    return summary


def _memory_summary(activities: list[Activity], peaks: Mapping[str, Any] | None) -> dict[str, Any]:
    comparable = [a for a in activities if not a.link]
    summary = _phase_rate(comparable, MEMORY_PHASES, "bytes", 1.0, (peaks or {}).get("gbps"))
    if summary:
        summary["gbps"] = summary.pop("rate")
    return summary


def _timed_idle(timed_ms: float | None, busy_ns: int) -> dict[str, float]:
    """Idle against the timed (untraced) median: ``max(0, timed - busy) / timed``."""
    if timed_ms is None or not math.isfinite(timed_ms) or timed_ms <= 0:
        return {}
    idle = max(0.0, timed_ms - busy_ns / 1e6)
    return {"ms": idle, "share": idle / timed_ms}


HOST_NOTE = ("no device activity in the trace: phases are the host ops' self time inside the call, "
             "idle is host time outside any op (Python)")


def summarize(source: str, activities: list[Activity], window: tuple[int, int] | None, *, label: str,
              peaks: Mapping[str, Any] | None = None, peaks_note: str | None = None, top: int = TOP_KERNELS,
              trace: str | None = None, device: str = "cpu", arch: str = "cpu", timed_ms: float | None = None,
              notes: Iterable[str] = ()) -> PhaseProfile:
    """The :class:`PhaseProfile` of ``activities`` (from :func:`activities_from_trace`); ``timed_ms``: the
    measurement's untraced median, to read idle against."""
    notes = list(notes)
    if source == "host":
        notes.append(HOST_NOTE)
    if not activities:
        notes.append("the call ran no profiled op or kernel: nothing to split into phases")
        return PhaseProfile(label, "none", trace=trace, notes=tuple(notes), device=device, arch=arch,
                            timed_ms=timed_ms)
    shares, busy = shared_time(activities)
    if source == "host" and window is not None:
        start, end = window
    else:
        start = min(s for a in activities for s, _ in a.spans)
        end = max(e for a in activities for _, e in a.spans)
    span = max(end - start, busy)
    per_phase = {phase: [0.0, 0] for phase in PHASES}
    for activity, share in zip(activities, shares):
        per_phase[activity.phase][0] += share
        per_phase[activity.phase][1] += 1
    per_phase["idle"][0] = float(span - busy)
    phases = {phase: {"ms": ns / 1e6, "share": ns / span if span else 0.0, "count": count}
              for phase, (ns, count) in per_phase.items()}
    if peaks_note:
        notes.append(peaks_note)
    return PhaseProfile(label, source, span_ms=span / 1e6, busy_ms=busy / 1e6, phases=phases,
                        kernels=_kernel_rows(activities, peaks, top), gemm=_gemm_summary(activities, peaks),
                        memory=_memory_summary(activities, peaks), timed_ms=timed_ms,
                        timed_idle=_timed_idle(timed_ms, busy), activities=len(activities), trace=trace,
                        peaks=None if not peaks else {k: peaks[k] for k in ("tflops", "gbps", "source", "profile")
                                                      if k in peaks},
                        notes=tuple(notes), device=device, arch=arch)


def summarize_trace(exported: Mapping[str, Any], flops: Mapping[int, tuple[int, str | None]] | None = None,
                    eager: tuple[Mapping[str, Any], Mapping[int, tuple[int, str | None]]] | None = None,
                    **kwargs: Any) -> PhaseProfile:
    """:func:`summarize` of the activities of an exported trace (``kwargs``: as for :func:`summarize`).
    ``eager``: (trace, FLOPs) of the same computation without its CUDA graph, to credit the replay's kernels."""
    source, activities, window = activities_from_trace(exported, flops)
    if eager is not None and source == "device":
        eager_source, eager_activities, _ = activities_from_trace(*eager)
        note = (credit_from_eager(activities, eager_activities) if eager_source == "device" else
                "the eager run's trace holds no device activity: nothing to credit the replay's kernels from")
        if note:
            kwargs["notes"] = (*kwargs.get("notes", ()), note)
    return summarize(source, activities, window, **kwargs)


def unavailable(label: str, reason: str, **kwargs: Any) -> PhaseProfile:
    """A profile that could not be taken, saying why (the test itself is not failed for it)."""
    return PhaseProfile(label, "unavailable", notes=(reason,), **kwargs)
