"""``DitBench``: the object behind the ``ditbench`` fixture. Measures, records, and gates speed claims.

It never sees the pytest session: the plugin passes in the test id, the lane, a ``record`` callback
(ledger + summary), a ``checks`` callback (the test's ``kernel_check`` outcomes) and an optional
``feed`` callback (pytest-benchmark). Correct before fast: it refuses to time anything in a test whose
``kernel_check`` failed.

With ``profile=True`` (or ``--ditgate-profile``) each measured call, and both sides of a pair, is run once
more under the profiler after its timing, through the ``profiler`` callback; the phase profiles are
recorded with the measurement. The timed samples never include a traced run. A call that replays its own
CUDA graph can name the same computation without the graph (``profile_eager=``, called with the measured
call's arguments): it is traced too, and its kernels' FLOPs and bytes are lent to the replay's, which have
none.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from pytest_ditgate.arguments import describe
from pytest_ditgate.bench.agreement import AGREED, agree, judge
from pytest_ditgate.bench.comparison import Comparison
from pytest_ditgate.bench.measurement import Measurement
from pytest_ditgate.bench.runner import check_pair, measure, measure_pair
from pytest_ditgate.bench.timers import Call
from pytest_ditgate.errors import DitgateUsageError, GateFailure


def _knobs(function: Callable[..., Any]) -> frozenset[str]:
    """The keyword options of ``measure``/``measure_pair`` (every other keyword goes to the timed function; a
    private one, ``_audit``, is the fixture's own)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return frozenset(name for name, p in inspect.signature(function).parameters.items()
                     if p.kind in kinds and not name.startswith("_"))


MEASURE_KNOBS = _knobs(measure)
PAIR_KNOBS = _knobs(measure_pair)  # min_speedup and beat_best are pair()'s own parameters, never in opts


def _eager_twins(value: Any, sides: int) -> tuple[Callable[..., Any] | None, ...]:
    """``profile_eager=`` as one callable (or None) per side: a callable for a measurement, a pair of them
    (either None) for ``pair``; anything else is a usage error, raised before any timing."""
    twins = (value,) if sides == 1 else (None, None) if value is None else value
    twins = tuple(twins) if isinstance(twins, list) else twins
    if not isinstance(twins, tuple) or len(twins) != sides or not all(t is None or callable(t) for t in twins):
        wanted = "a callable" if sides == 1 else "a pair (candidate's, reference's) of callables or None"
        raise DitgateUsageError(f"profile_eager must be {wanted}, got {value!r}")
    return twins


def check_min_speedup(value: Any) -> float | None:
    """``min_speedup``: a fraction in (-1, 1) (0.05: at least 5 % faster; -0.1: at most 10 % slower), or None
    (no bound here: the lane judges the speed). Anything else is a usage error before any timing: ``5`` meant
    as 5 % would ask for an impossible 500 %, and ``"5%"`` would fail only after the whole timing run."""
    if value is None:
        return None
    what = ("ditbench.pair: min_speedup is a fraction between -1 and 1 (0.05: the candidate at least 5 % faster; "
            "-0.1: at most 10 % slower; None: no bound here, the lane judges)")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        hint = "; write 0.05 for 5 %" if isinstance(value, str) else ""
        raise DitgateUsageError(f"{what}, got {describe(value)}{hint}")
    if not -1 < value < 1:
        hint = f"; did you mean {value / 100:g} ({value:g} %)?" if abs(value) < 100 else ""
        raise DitgateUsageError(f"{what}, got {value!r}{hint}")
    return float(value)


def refuse_tampered_before(what: str) -> None:
    """``timer_tampered`` when a timing function is already replaced before ``what`` runs anything: the test or
    code it imported did it, not the functions about to be timed."""
    from pytest_ditgate.timer_integrity import tampered_timers

    found = tampered_timers()
    if found:
        raise GateFailure("timer_tampered", f"{what}: refusing to time: timing functions were already replaced "
                          f"before it ran anything (by the test or code it imported): {', '.join(found)}. Time with "
                          "the real clocks: undo the patch before timing.")


@dataclass(repr=False)
class DitBench:
    """``ditbench(fn, *args, **opts) -> Measurement`` and ``ditbench.pair(candidate, reference, ...)``."""

    test: str
    lane: str
    #: (measurement, phase profiles as dicts) -> None
    record_measurement: Callable[[Measurement, list[dict[str, Any]]], None]
    #: (comparison, min_speedup or None, passed or None (not gated here), phase profiles as dicts) -> None
    record_comparison: Callable[[Comparison, "float | None", "bool | None", list[dict[str, Any]]], None]
    checks: Callable[[], list[tuple[str, bool, str | None]]]
    best: Callable[[Measurement], dict[str, Any] | None] = lambda m: None
    #: hands one result to pytest-benchmark (``--benchmark-json``): a Measurement, plus extra_info for a pair
    feed: Callable[..., None] | None = None
    defaults: dict[str, Any] = field(default_factory=dict)
    #: profile every measured call (``--ditgate-profile``); ``profile=`` per call overrides it
    profile: bool = False
    #: (call, label, timed median ms, the call without its CUDA graph or None) -> the phase profile of one
    #: traced run of the call, as a dict
    profiler: Callable[[Call, str, float, Call | None], dict[str, Any]] | None = None
    #: the run's hooks (``pytest_ditgate_before_pair``); None outside a pytest run
    hook: Any = None
    measurements: list[Measurement] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    _fed: bool = False

    def __repr__(self) -> str:  # pytest prints the fixture beside a failing test: keep it one short line
        return (f"<ditbench fixture: lane {self.lane}, {len(self.measurements)} measurement(s), "
                f"{len(self.comparisons)} pair(s)>")

    def _feed(self, m: Measurement, extra: dict[str, Any] | None = None) -> None:
        """pytest-benchmark takes one result per test: the first measurement or pair's candidate."""
        if self.feed is None or self._fed:
            return
        self._fed = True
        if extra is None:
            self.feed(m)
        else:
            self.feed(m, extra)

    def _refuse_unchecked(self) -> None:
        __tracebackhide__ = True
        failed = [(label, reason) for label, passed, reason in self.checks() if not passed]
        if failed:
            detail = ", ".join(f"{label} ({reason})" for label, reason in failed)
            raise GateFailure("unchecked", f"refusing to time: kernel_check failed earlier in this test: {detail}. "
                              "No timing is recorded for an output that failed its reference check.")

    def _options(self, opts: dict[str, Any]) -> dict[str, Any]:
        merged = dict(self.defaults)
        merged.update(opts)
        return merged

    def _profiles(self, wanted: bool, sides: list[tuple[Callable[..., Any], Measurement, Callable[..., Any] | None]],
                  args: tuple[Any, ...], fn_kwargs: dict[str, Any]) -> list[dict[str, Any]]:
        """The phase profile of each (function, its measurement, its eager twin) side, run on the measured
        arguments; the timed median goes along, for idle against the untraced time."""
        if not wanted or self.profiler is None:
            return []
        return [self.profiler(Call(fn, args, fn_kwargs), m.name, m.median_ms,
                              None if eager is None else Call(eager, args, fn_kwargs)) for fn, m, eager in sides]

    def __call__(self, fn: Callable[..., Any], *args: Any, **opts: Any) -> Measurement:
        """Measure ``fn(*args)`` (options as for :func:`pytest_ditgate.measure`) and record it;
        ``profile=True`` adds one traced run of the call and records its phase profile
        (``profile_eager=``: ``fn``'s computation without its CUDA graph, for the replay's rates)."""
        __tracebackhide__ = True
        self._refuse_unchecked()
        opts = self._options(opts)
        profile = bool(opts.pop("profile", self.profile))
        eager = _eager_twins(opts.pop("profile_eager", None), 1)[0]
        opts.setdefault("label", self.test.rsplit("::", 1)[-1])
        m = measure(fn, *args, **opts)
        self.measurements.append(m)
        fn_kwargs = {k: v for k, v in opts.items() if k not in MEASURE_KNOBS}
        self.record_measurement(m, self._profiles(profile, [(fn, m, eager)], args, fn_kwargs))
        self._feed(m)
        return m

    def pair(self, candidate: Callable[..., Any], reference: Callable[..., Any], *args: Any,
             min_speedup: float | None = 0.05, beat_best: bool = False, verify: bool = True,
             **opts: Any) -> Comparison:
        """Time both interleaved in this run; fail (reason ``too_slow``) unless the CI bound shows the
        candidate faster than the reference by at least ``min_speedup``, a fraction in (-1, 1) (negative: an
        allowed slowdown). ``min_speedup=None`` records the comparison without a bound here: a lane's speed
        test, judged by ``ditgate experiment`` (the summary says "judged by the lane").

        Correct before fast: first, once, the candidate's outputs on these arguments are checked against the
        reference's under the output's tolerance (:func:`agree`: ``check_kernel`` with one trial, whatever the
        arguments: closures and sizes too); a pair that computes different things fails with the check's reason
        and nothing is timed. Then every timed call gets fresh copies of the arguments and a random sample of the
        candidate's timed calls is audited (:mod:`pytest_ditgate.bench.audit`): ``output_audit``,
        ``stale_output``, ``input_mutated``, ``torch_tampered``; a timing function replaced before the pair is
        ``timer_tampered`` at once, one replaced while it runs ``timer_tampered`` after timing. Outputs that are
        not tensors are not compared, and the record says so; two functions that return None compare nothing
        unless the arguments they write are declared (a usage error otherwise). ``verify=False`` skips the
        agreement check and the output audits, for two functions not meant to agree.

        ``out_args``, ``inout_args``, ``scratch_args`` (positions or keyword names, as for ``check_kernel``;
        never passed to the functions): the arguments the functions write. Out and in-out arguments are compared
        after the call, by the agreement check and in the audited calls; scratch is not compared; none of their
        writes is ``input_mutated`` (:mod:`pytest_ditgate.bench.declared`).

        ``beat_best=True`` also requires the CI bound to beat the best ratio recorded for this test, arch
        and lane (same driver and torch) in the ledger. For ``--benchmark-json`` the candidate's samples
        are the test's result, with the reference, ratio and interval in ``extra_info``.
        ``profile_eager=(candidate's, reference's)``: each side without its CUDA graph (or None), for the
        replay's rates in the phase profiles.
        """
        __tracebackhide__ = True
        min_speedup = check_min_speedup(min_speedup)
        for name, value in (("beat_best", beat_best), ("verify", verify)):
            if not isinstance(value, bool):
                raise DitgateUsageError(f"ditbench.pair: {name} must be True or False, got {describe(value)}")
        self._refuse_unchecked()
        opts = self._options(opts)
        profile = bool(opts.pop("profile", self.profile))
        candidate_eager, reference_eager = _eager_twins(opts.pop("profile_eager", None), 2)
        fn_kwargs = {k: v for k, v in opts.items() if k not in PAIR_KNOBS}
        _, declared = check_pair(candidate, reference, **{k: v for k, v in opts.items() if k in PAIR_KNOBS})
        declared.check(args, fn_kwargs, "ditbench.pair")
        refuse_tampered_before("ditbench.pair")
        from pytest_ditgate.bench.audit import Audit
        from pytest_ditgate.bench.torch_state import TorchState

        torch_state = TorchState()  # before anything of the pair runs: the agreement check may change torch too
        if self.hook is not None:  # the pair's own arguments stay as they are: the declared ones are copied
            hook_args, hook_kwargs = declared.copies(args, fn_kwargs)
            self.hook.pytest_ditgate_before_pair(candidate=candidate, args=hook_args, kwargs=hook_kwargs)
        outputs = agree(candidate, reference, args, fn_kwargs, declared) if verify else "not compared (verify=False)"
        c = measure_pair(candidate, reference, *args, **opts,
                         _audit=Audit(judge(reference, declared) if outputs == AGREED else None, torch_state))
        checks = {"outputs": outputs, "audited_calls": c.a.extra.get("audited_calls"),
                  "inputs": c.a.extra.get("inputs")}
        if declared:
            checks["written"] = declared.describe()
        c = dataclasses.replace(c, checks=checks)
        self.comparisons.append(c)
        passed = None if min_speedup is None else c.faster_by_at_least(min_speedup)
        problem = None
        disagreement = c.disagreement(min_speedup)
        if passed is False:
            problem = (f"candidate is not faster than the reference by at least {min_speedup:.1%}: "
                       f"{c.describe()}; needs the CI's upper bound <= {1 - min_speedup:.4f}"
                       + (f"; {disagreement}" if disagreement else ""))
        elif beat_best:
            best = self.best(c.a)
            if best is not None and not c.ci_high < float(best["ratio"]):
                passed = False
                problem = (f"candidate does not beat the recorded best ratio {float(best['ratio']):.4f} "
                           f"(recorded {best.get('comparison', {}).get('a', {}).get('time_utc', '?')}): {c.describe()}")
        profiles = self._profiles(profile, [(candidate, c.a, candidate_eager), (reference, c.b, reference_eager)],
                                  *(declared.copies(args, fn_kwargs) if profile else (args, fn_kwargs)))
        self.record_comparison(c, min_speedup, passed, profiles)
        from pytest_ditgate.bench.pytest_benchmark_bridge import pair_info

        self._feed(c.a, pair_info(c, min_speedup, passed))
        if problem is not None:
            raise GateFailure("too_slow", problem, report=c)
        return c
