"""``measure`` and ``measure_pair``: plan a measurement, pick the mechanism, collect samples and provenance.

``mechanism="auto"`` tries the latency mechanisms (:data:`pytest_ditgate.bench.mechanisms.AUTO_ORDER`: latency,
events, wall) and keeps the first that works: the time a caller waits for decides. ``cupti`` (kernel time
only) and ``graph`` (replayed in a CUDA graph) are explicit choices. Beside a latency on a GPU, one traced run
of each call gives its busy time, the fraction of its latency the device sat idle, and the host
synchronisations it made (``Measurement.extra``). ``measure_pair`` times two functions interleaved (A B, B A,
A B, ...) with one mechanism so that clock and thermal drift hit both alike, then compares them round by
round; its timed calls are guarded (:class:`pytest_ditgate.bench.audit.PairGuard`: fresh inputs for each call,
audits of what the calls did), and it takes ``check_kernel``'s ``out_args``, ``inout_args`` and ``scratch_args``
for functions that write arguments (:mod:`pytest_ditgate.bench.declared`). Timing functions are checked before
and after timing (``timer_tampered``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from pytest_ditgate.arguments import (callable_name, clip, describe, raised_by, require_callable, require_int,
                                      require_number)
from pytest_ditgate.bench import l2 as l2mod
from pytest_ditgate.bench import timers
from pytest_ditgate.bench.comparison import Comparison, compare, idle_line, notable
from pytest_ditgate.bench.declared import Declared
from pytest_ditgate.bench.measurement import REGIMES, Measurement, as_tuples
from pytest_ditgate.bench.mechanisms import AUTO_ORDER, BY_NAME, LATENCY, MECHANISMS
from pytest_ditgate.bench.stats import METHODS
from pytest_ditgate.bench.timers import Call, CallRaised, Guard, HostOnlyError, Sampling, TimingError
from pytest_ditgate.dtypes import torch_name
from pytest_ditgate.errors import DitgateUsageError, GateFailure
from pytest_ditgate.timer_integrity import bindings, changed_bindings, restore_timers, tampered_timers, watch

DEFAULT_BUDGET_MS = 100.0
WARMUP_MS = 25.0
MIN_WARMUP, MAX_WARMUP = 3, 1000
#: graph_idle: "subtract" the device's idle gaps between graph nodes (kernel time) or "keep" them
GRAPH_IDLE_MODES = ("subtract", "keep")
#: the fewest rounds a pair takes: below it the 95 % interval of a paired bootstrap holds for no noise
#: (the same function against itself passes min_speedup=0 8 times in 40 at rounds=2)
MIN_PAIR_ROUNDS = 10


def refuse_tampered_timers() -> None:
    """``timer_tampered`` before anything is timed: a clock, or a clock a timing module bound, already replaced."""
    found = tampered_timers()
    if found:
        raise GateFailure("timer_tampered", f"refusing to time: these timing functions were replaced or wrapped: "
                          f"{', '.join(found)}")


def refuse_timers_tampered_while_timing(before: dict[str, Any]) -> None:
    """``timer_tampered`` after timing: a clock, or a name of a timing module (its :func:`bindings` ``before``
    timing), replaced while the timed functions ran (they run in this process, so one of them did it); what was
    replaced is put back."""
    found = list(dict.fromkeys(tampered_timers() + changed_bindings(before)))
    if found:
        restore_timers(before)
        raise GateFailure("timer_tampered", "timing functions were replaced or wrapped while the calls were timed, "
                          f"so by the timed code: {', '.join(found)} (the clocks and the timing modules' names are "
                          "put back; the samples, taken with the clocks bound before timing, are not recorded)")


@dataclass(frozen=True)
class Options:
    """The validated knobs of one measurement."""

    mechanism: str = "auto"
    warmup: int | None = None
    reps: int | None = None
    budget_ms: float | None = None
    l2: str = "warm"
    regime: str | None = None
    graph_idle: str = "subtract"

    def __post_init__(self) -> None:
        if not isinstance(self.mechanism, str) or (self.mechanism != "auto" and self.mechanism not in MECHANISMS):
            raise DitgateUsageError(f"mechanism={self.mechanism!r}: choose auto or one of {', '.join(MECHANISMS)}")
        l2mod.check_mode(self.l2)
        if self.regime is not None and self.regime not in REGIMES:
            raise DitgateUsageError(f"regime={self.regime!r}: choose from {', '.join(REGIMES)}")
        if self.graph_idle not in GRAPH_IDLE_MODES:
            raise DitgateUsageError(f"graph_idle={self.graph_idle!r}: choose from {', '.join(GRAPH_IDLE_MODES)}")
        if self.warmup is not None:
            require_int(self.warmup, "warmup", "measure", minimum=0)
        if self.reps is not None and (isinstance(self.reps, bool) or not isinstance(self.reps, int) or self.reps < 2):
            raise DitgateUsageError(f"measure: reps must be >= 2 (an integer; rounds= for a pair: statistics need at "
                                    f"least two samples), got {describe(self.reps)}")
        if self.budget_ms is not None:
            require_number(self.budget_ms, "budget_ms", "measure", minimum=0, exclusive=True)

    def regime_for(self, mechanism: str) -> str:
        natural = BY_NAME[mechanism].regime
        if self.regime is None or self.regime == natural:
            return natural
        if mechanism == "cupti":
            return self.regime
        raise TimingError(f"{mechanism} measures the {natural} regime only, {self.regime} was asked for")


def _warm_up(calls: Sequence[Call], warmup: int | None, guard: Guard | None = None) -> tuple[int, list[float], bool]:
    """Run each call ``warmup`` times (default: about WARMUP_MS), as the guard hands it out; returns the count, a
    host-clock estimate of each call's time (an upper bound: it includes launch and sync latency) and whether a
    call's arguments or output hold a CUDA tensor."""
    guard = guard if guard is not None else Guard(calls)
    estimates = []
    count = 0
    on_device = False
    for index, call in enumerate(calls):
        took, output = _host_ms(guard.call(index))  # what the call returns, and an estimate even at warmup=0
        on_device = on_device or timers.holds_cuda_tensor((call.fn, call.args, call.kwargs, output))
        done, elapsed, best = (0, 0.0, took) if warmup == 0 else (1, took, took)
        while True:
            if warmup is not None and done >= warmup:
                break
            if warmup is None and done >= MIN_WARMUP and (elapsed >= WARMUP_MS or done >= MAX_WARMUP):
                break
            took, _ = _host_ms(guard.call(index))
            elapsed += took
            best = min(best, took)
            done += 1
        estimates.append(best)
        count = done
    return count, estimates, on_device


def _host_ms(call: Call) -> tuple[float, Any]:
    """Host-clock milliseconds of one call, device synchronised, and its output."""
    clock = timers.CLOCK
    start = clock()
    output = call()
    timers.synchronize()
    return (clock() - start) * 1e3, output


def _rep_count(options: Options, per_sample_ms: float, low: int, high: int) -> int:
    if options.reps is not None:
        return options.reps
    budget = options.budget_ms if options.budget_ms is not None else DEFAULT_BUDGET_MS
    return int(max(low, min(high, budget / max(per_sample_ms, 1e-6))))


def _schedule(n_calls: int, rounds: int) -> list[int]:
    """``rounds`` rounds; with two calls the order alternates A B, B A so neither always goes first."""
    if n_calls == 1:
        return [0] * rounds
    order: list[int] = []
    for r in range(rounds):
        order.extend(range(n_calls) if r % 2 == 0 else reversed(range(n_calls)))
    return order


@dataclass
class _Run:
    mechanism: str
    regime: str
    samples: list[list[float]]
    calls_per_sample: list[int]
    note: str
    extras: list[dict[str, Any]]


def _run_mechanism(mechanism: str, calls: Sequence[Call], options: Options, estimates: Sequence[float],
                   device: Any, traced: list[dict[str, Any]] | None, guard: Guard) -> _Run:
    record = BY_NAME[mechanism]
    regime = options.regime_for(mechanism)
    flush = None
    if options.l2 == "cold" and mechanism != "graph":  # the graph rotates input copies instead
        if not device.is_cuda:
            raise TimingError("cold L2 needs a CUDA device")
        flush = l2mod.L2Flusher(device.l2_bytes, "cuda")
    def schedule(rounds: int) -> list[int]:
        guard.plan(rounds)
        return _schedule(len(calls), rounds)

    sampling = Sampling(estimates, flush, regime, device, options,
                        lambda per_sample, low, high: _rep_count(options, per_sample, low, high), schedule, guard)
    found = record.load()(calls, sampling)
    note = f"{record.label}: {record.description}" + found.note + ("; L2 flushed before each call"
                                                                  if flush is not None else "")
    run = _Run(mechanism, regime, found.samples, found.calls_per_sample, note, found.extras)
    if record.device and record.counts == LATENCY:
        run.note += _diagnose(calls, run, traced)
    idle = max((e.get("idle_fraction") or 0.0 for e in run.extras), default=0.0)
    if mechanism == "cupti" and idle > 0.10:
        run.note += (f"; launch-bound: the device sat idle {idle:.0%} of the call's span waiting for the host "
                     "(span in extra.span_median_ms), which kernel time does not count")
    return run


def _diagnose(calls: Sequence[Call], run: _Run, traced: list[dict[str, Any]] | None = None) -> str:
    """Beside a device latency: each call's busy time, the fraction of its latency the device sat idle, and
    the host synchronisations its function made, from one traced run of each call (``extra``; ``traced``: the
    one made before choosing the mechanism); a note when the device sat idle more than a few percent of a
    call's latency, or the call synchronised."""
    try:
        found = traced if traced is not None else timers.trace_calls(calls)
    except TimingError as exc:
        for extra in run.extras:
            extra["busy"] = f"not traced: {exc}"
        return f"; busy time not traced ({exc})"
    notes = []
    for index, (extra, samples, diagnosis) in enumerate(zip(run.extras, run.samples, found)):
        latency = statistics.median(samples)
        busy = diagnosis["busy_median_ms"]
        extra.update(diagnosis)
        extra["idle_fraction"] = (max(0.0, 1.0 - busy / latency) if busy is not None and latency > 0 else None)
        if notable(extra):
            who = f"call {index + 1}: " if len(calls) > 1 else ""
            notes.append(f"{who}{idle_line(extra)}")
    return ("; " + "; ".join(notes) + " (busy time and syncs from one traced run of each call)") if notes else ""


def _collect(calls: Sequence[Call], options: Options, roles: Sequence[str],
             guard: Guard | None = None) -> tuple[_Run, dict[str, str], int, Any, list[Any]]:
    """Warm up, then time; a timed function that raises is reported as that code's (:func:`_user_error`), unless
    the guard takes it back and the calls are timed once more (a pair whose perturbed inputs left the reference's
    domain: timed again on exact copies)."""
    guard = guard if guard is not None else Guard(calls)
    try:
        try:
            return _collect_samples(calls, options, guard)
        except CallRaised as raised:
            if not guard.retry(raised):
                raise
        return _collect_samples(calls, options, guard)
    except CallRaised as raised:
        failure = _user_error(calls, roles, raised)
        if isinstance(failure, GateFailure):
            raise failure from raised.error
        error = failure
    finally:
        guard.close()
    raise error  # the user's own exception, outside any handler: nothing chained to it


def _user_error(calls: Sequence[Call], roles: Sequence[str], raised: CallRaised) -> BaseException:
    """The first timed function's exception becomes a ``crash`` gate failure (the candidate crashed); any
    other's (a pair's reference) is raised as it is. Both are marked as the user's code."""
    index = next((i for i, call in enumerate(calls) if call.fn is raised.fn), 0)
    role = roles[index] if index < len(roles) else f"timed function {index + 1}"
    error = raised.error
    if isinstance(error, (GateFailure, DitgateUsageError)):
        return error
    raised_by(error, f"{role}, called by measure (no timing was recorded)")
    if index == 0:
        return GateFailure("crash", f"{role} raised {type(error).__name__} while being timed, so nothing was "
                                    f"timed or recorded: {clip(f'{type(error).__name__}: {error}')}")
    return error


def _collect_samples(calls: Sequence[Call], options: Options,
                     guard: Guard) -> tuple[_Run, dict[str, str], int, Any, list[Any]]:
    """Warm up, then time with the requested mechanism or the first that works; then check the timers again and
    finish the guard (a pair's audits). Returns the run, the notes per mechanism, the warm-up count, the device
    and the NVML snapshots (start, end)."""
    from pytest_ditgate.bench import nvml
    from pytest_ditgate.device import real_device

    refuse_tampered_timers()
    watched = bindings()
    on_gpu = timers.cuda_in_use()
    if options.l2 == "cold" and not on_gpu:
        raise DitgateUsageError("l2='cold' needs a CUDA device; this call runs on the host")
    guard.prepare()
    warmup, estimates, holds_cuda = _warm_up(calls, options.warmup, guard)
    notes: dict[str, str] = {}
    wanted = list(AUTO_ORDER if options.mechanism == "auto" else (options.mechanism,))
    traced, host_only = None, False
    if on_gpu and not holds_cuda and options.mechanism == "auto" and options.l2 != "cold":
        traced, host_only = _trace_for_auto(calls)
    on_gpu = on_gpu and not host_only  # a call that does no device work is the host's: timed on its clock
    device = real_device() if on_gpu else _host_device()
    clocks_start = nvml.snapshot(device.index, device.uuid) if on_gpu else None
    run = None
    for mechanism in wanted:
        if run is not None:
            notes[mechanism] = f"not used: {run.mechanism} worked and comes first"
            continue
        if BY_NAME[mechanism].device and host_only:
            notes[mechanism] = "not used: the call launches no device work"
            continue
        if BY_NAME[mechanism].device and not on_gpu:
            notes[mechanism] = "not available: no CUDA device in use (torch with CUDA not imported or no GPU)"
            continue
        try:
            with timing_lock(on_gpu):
                run = _run_mechanism(mechanism, calls, options, estimates, device, traced, guard)
        except HostOnlyError as exc:
            host_only = True
            notes[mechanism] = f"failed: {exc}"
        except TimingError as exc:
            notes[mechanism] = f"failed: {exc}"
            from pytest_ditgate.bench.graphs import CaptureRefused

            if isinstance(exc, CaptureRefused) and "latency" not in wanted:
                wanted.append("latency")  # what the call costs its caller, host waits included
                notes[mechanism] += "; measured by latency instead"
        else:
            reason = "requested" if options.mechanism != "auto" else "auto: the first latency mechanism that worked"
            notes[mechanism] = f"chosen ({reason}): {run.note}"
    if run is None:
        detail = "; ".join(f"{k}: {v}" for k, v in notes.items())
        raise DitgateUsageError(f"no timing mechanism could measure this call ({detail})")
    refuse_timers_tampered_while_timing(watched)
    run.extras[0].update(guard.finish())
    clocks_end = nvml.snapshot(device.index, device.uuid) if on_gpu else None
    return run, notes, warmup, device, [clocks_start, clocks_end]


def _trace_for_auto(calls: Sequence[Call]) -> tuple[list[dict[str, Any]] | None, bool]:
    """For calls that hold no CUDA tensor in their arguments or outputs, on a machine with a GPU: one traced
    run of each before ``auto`` chooses (the latency's diagnosis reuses it), to tell whether every call runs
    on the host alone (a CPU function is then timed by the host clock, as on a machine without a GPU). A trace
    that cannot be made decides nothing: the device mechanisms are tried."""
    try:
        traced = timers.trace_calls(calls)
    except TimingError:
        return None, False
    return traced, timers.runs_on_host(traced)


def timing_lock(on_gpu: bool) -> Any:
    """The run's per-GPU timing lock (``gpus.exclusive_gpu``: xdist workers sharing a GPU never time at once)."""
    import contextlib

    if not on_gpu:
        return contextlib.nullcontext()
    from pytest_ditgate.gpus import exclusive_gpu

    return exclusive_gpu()


def _host_device() -> Any:
    from pytest_ditgate.device_info import DeviceInfo

    import sys

    torch = sys.modules.get("torch")
    return DeviceInfo(name="cpu", arch="cpu", torch=getattr(torch, "__version__", None), cpu_reason="host clock")


def _build(run: _Run, index: int, notes: dict[str, str], warmup: int, device: Any, clocks: list[Any],
           options: Options, *, label: str | None, backend: str | None, dtype: Any, shapes: Any) -> Measurement:
    """The Measurement of call ``index`` of ``run``."""
    return Measurement.from_samples(
        run.samples[index],
        warmup=warmup,
        mechanism=run.mechanism,
        regime=run.regime,
        l2_mode=options.l2,
        mechanism_notes=dict(notes),
        calls_per_sample=run.calls_per_sample[index],
        extra=dict(run.extras[index]),
        device=device.name,
        arch=device.arch,
        driver=device.driver,
        cuda=device.cuda_runtime,
        torch=device.torch,
        triton=device.triton,
        clocks_start=clocks[0],
        clocks_end=clocks[1],
        backend=backend,
        shapes=as_tuples(shapes),
        dtype=None if dtype is None else torch_name(dtype),
        label=label,
    )


def _check_text(**values: Any) -> None:
    for name, value in values.items():
        if value is not None and not isinstance(value, str):
            raise DitgateUsageError(f"measure: {name} must be a string, got {describe(value)}")


def measure(fn: Callable[..., Any], *args: Any, mechanism: str = "auto", warmup: int | None = None,
            reps: int | None = None, budget_ms: float | None = None, l2: str = "warm", label: str | None = None,
            backend: str | None = None, dtype: Any = None, shapes: Any = None, regime: str | None = None,
            graph_idle: str = "subtract", **fn_kwargs: Any) -> Measurement:
    """Time ``fn(*args, **fn_kwargs)`` and return a :class:`Measurement` with its provenance.

    ``warmup``/``reps`` are counts; without ``reps`` the sample count comes from ``budget_ms`` (default
    100 ms of sampling). ``l2="cold"`` flushes L2 between calls (graph mode: rotates input copies).
    ``regime`` is "spaced" or "sustained" (cupti can do both; graph is sustained, events and wall spaced).
    ``graph_idle="keep"`` leaves the device's idle gaps between graph nodes in graph samples (the time a
    graph-replayed pipeline sees) instead of subtracting them (kernel time, comparable with cupti).
    """
    require_callable(fn, "fn", "measure(fn, *args)", "the function to time, called as fn(*args, **kwargs)")
    _check_text(label=label, backend=backend)
    options = Options(mechanism, warmup, reps, budget_ms, l2, regime, graph_idle)
    run, notes, done, device, clocks = _collect([Call(fn, args, fn_kwargs)], options,
                                                [f"the timed function `{callable_name(fn)}`"])
    return _build(run, 0, notes, done, device, clocks, options, label=label, backend=backend, dtype=dtype,
                  shapes=shapes)


#: how a pair is named in its usage errors
PAIR_CALL = "measure_pair(candidate, reference, *args)"


def check_pair(candidate: Any, reference: Any, *, rounds: Any = None, mechanism: Any = "auto", warmup: Any = None,
               budget_ms: Any = None, l2: Any = "warm", regime: Any = None, method: Any = "paired-bootstrap",
               confidence: Any = 0.95, labels: Any = ("candidate", "reference"), graph_idle: Any = "subtract",
               perturb: Any = True, out_args: Any = (), inout_args: Any = (), scratch_args: Any = (),
               **_: Any) -> tuple[Options, Declared]:
    """The options of a pair and the arguments it declares written, every argument checked (a usage error naming
    it), before any function of the pair runs; other keywords are ignored (the timed functions' own,
    ``backend``, ...)."""
    call = PAIR_CALL
    require_callable(candidate, "candidate", call, "the function to time, called as candidate(*args, **kwargs)")
    require_callable(reference, "reference", call, "the function to compare with, called with the same arguments")
    if method not in METHODS:
        raise DitgateUsageError(f"{call}: method={method!r}: choose from {', '.join(METHODS)}")
    if not (isinstance(confidence, float) and 0 < confidence < 1):
        raise DitgateUsageError(f"{call}: confidence must be a fraction between 0 and 1 (like 0.95), got "
                                f"{describe(confidence)}")
    if not (isinstance(labels, (tuple, list)) and len(labels) == 2 and all(isinstance(x, str) for x in labels)):
        raise DitgateUsageError(f"{call}: labels must be two strings (candidate's, reference's), got "
                                f"{describe(labels)}")
    if rounds is not None and not isinstance(rounds, bool) and isinstance(rounds, int) and rounds < MIN_PAIR_ROUNDS:
        raise DitgateUsageError(f"{call}: rounds={rounds}: a pair takes at least {MIN_PAIR_ROUNDS} rounds (below that "
                                f"its {confidence:.0%} interval does not hold: the same function against itself passes "
                                f"min_speedup=0 far more often than {(1 - confidence) / 2:.1%} of the time); "
                                f"write rounds={MIN_PAIR_ROUNDS} or more, or leave it to budget_ms")
    if not isinstance(perturb, bool):
        raise DitgateUsageError(f"{call}: perturb must be True or False, got {describe(perturb)}")
    declared = Declared.parse(call, out_args=out_args, inout_args=inout_args, scratch_args=scratch_args)
    return Options(mechanism, warmup, rounds, budget_ms, l2, regime, graph_idle), declared


def measure_pair(candidate: Callable[..., Any], reference: Callable[..., Any], *args: Any, rounds: int | None = None,
                 mechanism: str = "auto", warmup: int | None = None, budget_ms: float | None = None,
                 l2: str = "warm", regime: str | None = None, method: str = "paired-bootstrap",
                 confidence: float = 0.95, labels: tuple[str, str] = ("candidate", "reference"),
                 backend: tuple[str | None, str | None] | str | None = None, dtype: Any = None, shapes: Any = None,
                 graph_idle: str = "subtract", perturb: bool = True, out_args: tuple[int | str, ...] = (),
                 inout_args: tuple[int | str, ...] = (), scratch_args: tuple[int | str, ...] = (), _audit: Any = None,
                 **fn_kwargs: Any) -> Comparison:
    """Time ``candidate`` and ``reference`` on the same arguments, interleaved round by round, and compare.

    ``rounds`` samples per side, at least :data:`MIN_PAIR_ROUNDS` (default from ``budget_ms``); the result's
    ``ratio`` is median(candidate) / median(reference) with a ``confidence`` interval by ``method``. Each timed
    call gets fresh copies of the tensor arguments, one element of each floating one changed unless
    ``perturb=False`` (for functions whose inputs must keep their exact values), and the candidate's calls are
    audited (:mod:`pytest_ditgate.bench.audit`); ``_audit`` is how ``ditbench.pair`` adds its output judge.
    ``out_args``, ``inout_args``, ``scratch_args``: the arguments the functions write, as for ``check_kernel``
    (positions or keyword names; :mod:`pytest_ditgate.bench.declared`); never passed to the functions.
    """
    options, declared = check_pair(candidate, reference, rounds=rounds, mechanism=mechanism, warmup=warmup,
                                   budget_ms=budget_ms, l2=l2, regime=regime, method=method, confidence=confidence,
                                   labels=labels, graph_idle=graph_idle, perturb=perturb, out_args=out_args,
                                   inout_args=inout_args, scratch_args=scratch_args)
    declared.check(args, fn_kwargs, PAIR_CALL)
    args, fn_kwargs = declared.copies(args, fn_kwargs)  # traces and graph captures write these, not the pair's own
    calls = [Call(candidate, args, fn_kwargs), Call(reference, args, fn_kwargs)]
    roles = [f"the {labels[0]} `{callable_name(candidate)}`", f"the {labels[1]} `{callable_name(reference)}`"]
    from pytest_ditgate.bench.audit import PairGuard

    guard = PairGuard(calls, perturb=perturb, declared=declared, audit=_audit)
    run, notes, done, device, clocks = _collect(calls, options, roles, guard)
    backends = backend if isinstance(backend, tuple) else (backend, backend)
    a, b = (_build(run, i, notes, done, device, clocks, options, label=labels[i], backend=backends[i],
                   dtype=dtype, shapes=shapes) for i in range(2))
    return compare(a, b, method=method, confidence=confidence)


watch(__name__)
