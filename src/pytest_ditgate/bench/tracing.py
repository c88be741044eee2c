"""Take the phase profile of one call: trace it once with ``torch.profiler`` (CUDA activity from CUPTI
when a CUDA device is in use, host ops otherwise), write the Chrome/Perfetto trace, summarise it.

torch is imported inside the functions. Profiling is a diagnosis, never a gate: when it cannot be done
(no torch, the profiler busy, the trace not writable) the result is a profile of source
``unavailable`` that says why, and the test goes on.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from pytest_ditgate.bench.profiling import PROFILE_DIR, WINDOW, PhaseProfile, summarize_trace, unavailable
from pytest_ditgate.bench.runner import timing_lock
from pytest_ditgate.bench.timers import Call, TimingError, cuda_in_use, profiled, synchronize
from pytest_ditgate.dtypes import PEAK_KEY_OF_PROFILER
from pytest_ditgate.fsutil import atomic_write_text

CPU_PEAKS_NOTE = "CPU run: no peaks, rates are absolute"


def trace_file(test: str, label: str | None) -> str:
    """A file name for the trace of ``label`` in ``test``: readable, safe on every OS, unique per pair."""
    key = f"{test}[{label}]" if label else test
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", key.rsplit("/", 1)[-1]).strip("._")[:80]
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:10]
    return f"{slug}-{digest}.json"


def flop_counts(events: Any) -> dict[int, tuple[int, str | None]]:
    """op id (the trace's ``External id``) -> (FLOPs torch reported, dtype key of its first input)."""
    counts: dict[int, tuple[int, str | None]] = {}
    for event in events or ():
        try:
            flops = int(event.flops())
        except Exception:
            continue
        if flops > 0:
            try:
                dtypes = list(event.dtypes())
            except Exception:
                dtypes = []
            counts[int(event.correlation_id())] = (flops, PEAK_KEY_OF_PROFILER.get(dtypes[0]) if dtypes else None)
    return counts


def _device() -> Any:
    from pytest_ditgate.device import real_device
    from pytest_ditgate.device_info import DeviceInfo

    return real_device() if cuda_in_use() else DeviceInfo(name="cpu", arch="cpu")


def _traced(call: Call, path: Path, on_gpu: bool) -> tuple[dict[str, Any], dict[int, tuple[int, str | None]]]:
    """One traced run of ``call`` inside the ``ditgate::profile`` range: its exported trace (written to
    ``path``, naming no folder of ours) and the FLOPs torch reported per op."""
    import torch

    def run() -> None:
        with torch.profiler.record_function(WINDOW):
            call()

    synchronize()
    with timing_lock(on_gpu):  # the measurement's lock: no other worker times while this traces
        events = profiled(run, host=True, device=on_gpu, flops=True, export=path)
    trace = json.loads(path.read_text(encoding="utf-8"))
    if "traceName" in trace:  # torch writes the trace's absolute path: a shared trace names no folder of ours
        trace["traceName"] = path.name
        atomic_write_text(path, json.dumps(trace))
    return trace, flop_counts(events)


EagerTrace = tuple[dict[str, Any], dict[int, tuple[int, str | None]]]


def traced_eager(eager: Call, path: Path, on_gpu: bool) -> tuple[EagerTrace | None, str | None]:
    """The eager twin's trace and FLOPs, or None and why not: the twin has never run before (it gets the
    measured call's arguments), so any error of its own is a note on the profile, never the test's failure."""
    try:
        return _traced(eager, path, on_gpu), None
    except Exception as exc:  # noqa: BLE001 - a profile is a diagnosis: it never fails the test
        return None, (f"the eager run (profile_eager) was not traced, so the replay's kernels have no rates: "
                      f"{type(exc).__name__}: {exc}")


def profile_call(call: Call, *, label: str, artefact_dir: Path, test: str, timed_ms: float | None = None,
                 eager: Call | None = None) -> PhaseProfile:
    """One traced run of ``call`` (already warm: after its measurement) and its phase profile; the trace
    goes to ``<artefact_dir>/profiles/`` and the profile names it relative to ``artefact_dir``.
    ``timed_ms``: the measurement's untraced median, to read idle against. A call that replays a CUDA
    graph is traced as it is: CUPTI records the replay's kernels (without a launching op, so without FLOPs
    or bytes). ``eager``: the same computation without the graph, called with the same arguments; on a CUDA
    device it is traced once more (its trace beside the call's, ``-eager`` added) and lends the replay's
    kernels its kernels' amounts (:func:`~pytest_ditgate.bench.profiling.credit_from_eager`)."""
    relative = f"{PROFILE_DIR}/{trace_file(test, label)}"
    path = Path(artefact_dir) / relative
    try:
        import torch  # noqa: F401 - traced in _traced; here only to say why there is no profile
    except ImportError:
        return unavailable(label, "torch is not installed: phase profiling needs torch.profiler")
    on_gpu = cuda_in_use()
    device = _device()
    where = {"device": device.name, "arch": device.arch}

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        trace, flops = _traced(call, path, on_gpu)
    except TimingError as exc:
        return unavailable(label, f"not profiled: {exc}", timed_ms=timed_ms, **where)
    except (OSError, ValueError) as exc:
        return unavailable(label, f"not profiled: the trace {path} could not be written or read ({exc})",
                           timed_ms=timed_ms, **where)
    eager_trace, notes = None, []
    if eager is not None and on_gpu:  # a host profile's ops carry their own amounts: nothing to lend
        eager_trace, problem = traced_eager(eager, path.with_name(f"{path.stem}-eager.json"), on_gpu)
        notes += [problem] if problem else []
    if on_gpu:
        from pytest_ditgate.profiles import peaks_for

        peaks, note = peaks_for(device.name, device.arch)
    else:
        peaks, note = None, CPU_PEAKS_NOTE
    return summarize_trace(trace, flops, eager_trace, label=label, peaks=peaks, peaks_note=note, trace=relative,
                           timed_ms=timed_ms, notes=notes, **where)
