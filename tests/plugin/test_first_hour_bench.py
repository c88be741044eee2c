"""A new user's first hour with ``ditbench`` and ``measure`` (issue 37): arguments checked before any timing,
``min_speedup`` a fraction (or None: judged by the lane), a timed candidate that raises is the ``crash``
verdict, a reference that raises is its own error, and nothing is recorded for either."""

from __future__ import annotations

import pytest

from pytest_ditgate.bench import measure, measure_pair
from pytest_ditgate.bench.fixture import DitBench
from pytest_ditgate.bench.report import comparison_row, summary_lines
from pytest_ditgate.errors import DitgateUsageError, GateFailure


def _work(n: int = 200) -> int:
    return sum(range(n))


class _Recorder:
    """A DitBench wired to lists instead of the ledger: what was recorded, and which user functions ran."""

    def __init__(self) -> None:
        self.measurements: list = []
        self.comparisons: list = []
        self.calls: list[str] = []
        self.bench = DitBench(test="t.py::test_x", lane="default",
                              record_measurement=lambda m, p: self.measurements.append(m),
                              record_comparison=lambda c, s, ok, p: self.comparisons.append((c, s, ok)),
                              checks=lambda: [], defaults={"mechanism": "wall", "warmup": 1, "budget_ms": 2.0})

    def fn(self, name: str, body=_work):
        def timed(*args, **kwargs):
            self.calls.append(name)
            return body(*args, **kwargs)
        timed.__qualname__ = name
        return timed


@pytest.mark.parametrize("value, message", [
    (5, "min_speedup is a fraction between -1 and 1*got 5; did you mean 0.05 (5 %)?"),
    ("5%", "min_speedup is a fraction between -1 and 1*got str '5%'; write 0.05 for 5 %"),
    (1.0, "*got 1.0; did you mean 0.01 (1 %)?"),
    (-1, "*got -1; did you mean -0.01 (-1 %)?"),
    (-1e6, "*got -1000000.0"),
    (float("nan"), "*got float nan"),
    (True, "*got bool True"),
])
def test_min_speedup_is_a_fraction_checked_before_any_timing(value, message: str) -> None:
    rec = _Recorder()
    with pytest.raises(DitgateUsageError) as excinfo:
        rec.bench.pair(rec.fn("fast"), rec.fn("slow"), min_speedup=value)
    assert excinfo.match(message.replace("*", ".*").replace("(", r"\(").replace(")", r"\)").replace("?", r"\?"))
    assert rec.calls == [] and rec.comparisons == []  # nothing timed, nothing recorded


def test_min_speedup_none_records_the_pair_for_the_lane_to_judge() -> None:
    rec = _Recorder()
    c = rec.bench.pair(rec.fn("candidate", lambda: _work(3000)), rec.fn("reference", lambda: _work(30)),
                       min_speedup=None)  # far slower, yet not failed here: the lane judges
    ((recorded, bound, passed),) = rec.comparisons
    assert recorded is c and bound is None and passed is None
    (line,) = summary_lines([comparison_row("t.py::test_x", c, None, None)])
    assert "judged by the lane" in line and "needs <=" not in line and "PASS" not in line
    (gated,) = summary_lines([comparison_row("t.py::test_x", c, 0.05, False)])
    assert "needs <= 0.9500 FAIL" in gated


@pytest.mark.parametrize("call, message", [
    (lambda b, f: b(None), "measure(fn, *args): fn must be a callable*got None"),
    (lambda b, f: b.pair(f, "reference"), "measure_pair(candidate, reference, *args): reference must be a callable*"),
    (lambda b, f: b.pair(f, f, beat_best="yes"), "beat_best must be True or False, got str 'yes'"),
    (lambda b, f: b(f, reps="3"), "reps must be >= 2*got str '3'"),
    (lambda b, f: b(f, warmup=-1), "warmup must be an integer >= 0, got int -1"),
    (lambda b, f: b(f, budget_ms=float("nan")), "budget_ms must be > 0 (a finite number), got float nan"),
    (lambda b, f: b.pair(f, f, method="t-test"), "method='t-test': choose from bootstrap, paired-bootstrap*"),
    (lambda b, f: b.pair(f, f, confidence=95), "confidence must be a fraction between 0 and 1*got int 95"),
    (lambda b, f: b.pair(f, f, labels="ab"), "labels must be two strings*got str 'ab'"),
    (lambda b, f: b(f, label=7), "label must be a string, got int 7"),
])
def test_bad_arguments_are_usage_errors_before_any_timing(call, message: str) -> None:
    rec = _Recorder()
    with pytest.raises(DitgateUsageError) as excinfo:
        call(rec.bench, rec.fn("fn"))
    assert excinfo.match(message.replace("*", ".*").replace("(", r"\(").replace(")", r"\)").replace("[", r"\["))
    assert rec.calls == [] and rec.measurements == [] and rec.comparisons == []


def test_a_candidate_that_raises_is_the_crash_verdict_and_nothing_is_recorded() -> None:
    rec = _Recorder()

    def broken():
        raise KeyError("no such config")

    with pytest.raises(GateFailure) as excinfo:
        rec.bench.pair(broken, rec.fn("reference"))
    failure = excinfo.value
    assert failure.reason == "crash"
    assert str(failure).startswith("[crash] the candidate `test_a_candidate_that_raises_is_the_crash_verdict_and_nothing_"
                                   "is_recorded.<locals>.broken` raised KeyError when checked against the reference "
                                   "before timing, so nothing was timed or recorded: KeyError: 'no such config'")
    assert isinstance(failure.__cause__, KeyError)  # the user's exception, with its own frames, as the cause
    assert failure.__cause__.__notes__[0].startswith("ditgate: raised by the candidate `")
    assert rec.comparisons == [] and rec.measurements == []
    with pytest.raises(GateFailure, match=r"^\[crash\] the timed function `.*broken` raised KeyError"):
        rec.bench(broken)
    assert rec.measurements == []


def test_a_reference_that_raises_is_its_own_error() -> None:
    rec = _Recorder()

    def reference():
        raise ValueError("reference bug")

    with pytest.raises(ValueError, match="reference bug") as excinfo:
        rec.bench.pair(rec.fn("candidate"), reference, min_speedup=None)
    assert excinfo.value.__context__ is None  # not chained to the plugin's own bookkeeping
    assert "raised by the reference `" in excinfo.value.__notes__[0]
    assert rec.comparisons == []


def test_measure_and_measure_pair_check_before_timing() -> None:
    with pytest.raises(DitgateUsageError, match=r"fn must be a callable .*got str 'work'"):
        measure("work")
    with pytest.raises(DitgateUsageError, match="candidate must be a callable"):
        measure_pair(3, _work)
    m = measure(_work, reps=3, warmup=0)
    with pytest.raises(AttributeError, match=r"has no attribute 'median'; did you mean median_ms\? \(times are in "
                                             r"milliseconds, named \*_ms\)"):
        m.median  # noqa: B018 - the README once said so
    assert m.median_ms > 0
    from pytest_ditgate.bench import compare

    with pytest.raises(DitgateUsageError, match=r"compare\(a, b\): b must be a Measurement .*got float 1.5"):
        compare(m, 1.5)


PAIR_SUITE = """
def slow():
    return sum(range(20000))

def broken():
    raise KeyError("no such config")

def test_crash(ditbench):
    ditbench.pair(broken, slow)

def test_percent(ditbench):
    ditbench.pair(slow, slow, min_speedup="5%")
"""


def test_a_crash_reads_as_the_users_code_in_the_report(pytester: pytest.Pytester) -> None:
    """A subprocess (in-process runs of ditbench crashed CPython here, see test_bench_fixture.py)."""
    pytester.makepyfile(test_pair=PAIR_SUITE)
    result = pytester.runpytest_subprocess("--ditgate", "-p", "no:cacheprovider", "-p", "no:benchmark")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*raise KeyError(\"no such config\")", "E       KeyError: 'no such config'",
                                 "E       ditgate: raised by the candidate `broken` on its first call*",
                                 "*[[]crash[]] the candidate `broken` raised KeyError when checked against the reference*",
                                 "*min_speedup is a fraction between -1 and 1 *got str '5%'; write 0.05 for 5 %",
                                 "FAILED test_pair.py::test_crash - [[]crash[]] *"])
    out = result.stdout.str()
    for internal in ("bench/runner.py", "bench/timers.py", "bench/fixture.py"):
        assert internal not in out, internal
    assert "ditbench = <ditbench fixture: lane default, 0 measurement(s), 0 pair(s)>" in out
    assert "TypeError" not in out  # "5%" no longer reaches the arithmetic after the timing run
    assert not (pytester.path / ".ditgate" / "bench.jsonl").exists()  # nothing recorded
