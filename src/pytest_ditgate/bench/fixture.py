"""``DitBench``: the object behind the ``ditbench`` fixture. Measures, records, and gates speed claims.

It never sees the pytest session: the plugin passes in the test id, the lane, a ``record`` callback
(ledger + summary), a ``checks`` callback (the test's ``kernel_check`` outcomes) and an optional
``feed`` callback (pytest-benchmark). Correct before fast: it refuses to time anything in a test whose
``kernel_check`` failed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from pytest_ditgate.bench.comparison import Comparison
from pytest_ditgate.bench.measurement import Measurement
from pytest_ditgate.bench.runner import measure, measure_pair
from pytest_ditgate.errors import GateFailure


@dataclass
class DitBench:
    """``ditbench(fn, *args, **opts) -> Measurement`` and ``ditbench.pair(candidate, reference, ...)``."""

    test: str
    lane: str
    record_measurement: Callable[[Measurement], None]
    record_comparison: Callable[[Comparison, float, bool], None]
    checks: Callable[[], list[tuple[str, bool, str | None]]]
    best: Callable[[Measurement], dict[str, Any] | None] = lambda m: None
    #: hands one result to pytest-benchmark (``--benchmark-json``): a Measurement, plus extra_info for a pair
    feed: Callable[..., None] | None = None
    defaults: dict[str, Any] = field(default_factory=dict)
    measurements: list[Measurement] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    _fed: bool = False

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

    def __call__(self, fn: Callable[..., Any], *args: Any, **opts: Any) -> Measurement:
        """Measure ``fn(*args)`` (options as for :func:`pytest_ditgate.measure`) and record it."""
        __tracebackhide__ = True
        self._refuse_unchecked()
        opts = self._options(opts)
        opts.setdefault("label", self.test.rsplit("::", 1)[-1])
        m = measure(fn, *args, **opts)
        self.measurements.append(m)
        self.record_measurement(m)
        self._feed(m)
        return m

    def pair(self, candidate: Callable[..., Any], reference: Callable[..., Any], *args: Any,
             min_speedup: float = 0.05, beat_best: bool = False, **opts: Any) -> Comparison:
        """Time both interleaved in this run; fail (reason ``too_slow``) unless the CI bound shows the
        candidate faster than the reference by at least ``min_speedup`` (negative: allowed slowdown).

        ``beat_best=True`` also requires the CI bound to beat the best ratio recorded for this test, arch
        and lane (same driver and torch) in the ledger. For ``--benchmark-json`` the candidate's samples
        are the test's result, with the reference, ratio and interval in ``extra_info``.
        """
        __tracebackhide__ = True
        self._refuse_unchecked()
        opts = self._options(opts)
        c = measure_pair(candidate, reference, *args, **opts)
        self.comparisons.append(c)
        passed = c.faster_by_at_least(min_speedup)
        problem = None
        if not passed:
            problem = (f"candidate is not faster than the reference by at least {min_speedup:.1%}: "
                       f"{c.describe()}; needs the CI's upper bound <= {1 - min_speedup:.4f}")
        elif beat_best:
            best = self.best(c.a)
            if best is not None and not c.ci_high < float(best["ratio"]):
                passed = False
                problem = (f"candidate does not beat the recorded best ratio {float(best['ratio']):.4f} "
                           f"(recorded {best.get('comparison', {}).get('a', {}).get('time_utc', '?')}): {c.describe()}")
        self.record_comparison(c, min_speedup, passed)
        from pytest_ditgate.bench.pytest_benchmark_bridge import pair_info

        self._feed(c.a, pair_info(c, min_speedup, passed))
        if problem is not None:
            raise GateFailure("too_slow", problem, report=c)
        return c
