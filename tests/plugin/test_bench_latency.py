"""What decides a speed verdict: the call's latency, what the caller waits for (issue 47). The mechanism records,
the diagnosis beside a latency (busy time, idle fraction, host synchronisations) from a fake profiler's trace,
and a pair judged on latency where busy time alone would pass it. On the CPU, wall is the mechanism."""

from __future__ import annotations

import pytest

# loaded here, before any inline run: pytester drops the modules an inline run imported, so a file that ran
# first could leave the plugin and the fake below (which patches fixture.measure_pair) two copies of the module
from pytest_ditgate.bench import fixture as _pair_fixture  # noqa: F401
from pytest_ditgate.bench import mechanisms
from pytest_ditgate.bench.comparison import compare
from pytest_ditgate.bench.measurement import Measurement
from pytest_ditgate.bench.timers import (CALL_RANGE, FN_RANGE, Activity, TimingError, latency_batch,
                                         summarize_calls)

from host_only import no_cuda  # noqa: F401 - a fixture: the host-clock test hides a GPU host's device


def test_each_mechanism_is_one_record_and_auto_takes_the_latency_ones() -> None:
    assert mechanisms.MECHANISMS == ("latency", "events", "wall", "cupti", "graph")
    assert mechanisms.AUTO_ORDER == ("latency", "events", "wall")
    assert mechanisms.DEVICE_TIMERS == ("latency", "events", "cupti", "graph")
    assert {m.name for m in mechanisms.RECORDS if m.counts == mechanisms.BUSY} == {"cupti", "graph"}
    for record in mechanisms.RECORDS:
        assert callable(record.load()), record.name  # the dispatch goes through the record
    assert mechanisms.BY_NAME["cupti"].label == "busy (kernel time only)"
    from pytest_ditgate.bench.options import MECHANISM
    from pytest_ditgate.experiment import evidence

    assert MECHANISM.choices == ("auto", *mechanisms.MECHANISMS)
    assert evidence.DEVICE_TIMERS is mechanisms.DEVICE_TIMERS


def _call(start: int, end: int, fn_end: int, kernels: list[tuple[int, int]], syncs: list[tuple[int, int]],
          launches: bool = True) -> list[Activity]:
    found = [Activity(CALL_RANGE, False, start, end, True), Activity(FN_RANGE, False, start + 1, fn_end, True)]
    found += [Activity("kernel", True, a, b) for a, b in kernels]
    found += [Activity("cudaStreamSynchronize", False, a, b) for a, b in syncs]
    if launches:
        found += [Activity("cudaLaunchKernel", False, a - 5, a - 3) for a, _ in kernels]
    return found


def test_the_diagnosis_counts_busy_time_and_the_functions_own_host_syncs() -> None:
    """A fake profiler's trace of two calls: the candidate runs a 100 ns kernel, waits for it (``.item()``:
    one cudaStreamSynchronize inside its function), then another 100 ns kernel; the reference runs 300 ns of
    kernels back to back. The synchronisation that ends each traced call (outside the function) is not its."""
    candidate = _call(0, 1000, 800, [(10, 110), (600, 700)], [(120, 590), (810, 990)])
    reference = _call(2000, 3000, 2400, [(2010, 2210), (2210, 2310)], [(2410, 2990)])
    found = summarize_calls(candidate + reference, [0, 1], 2)
    assert found[0] == {"busy_median_ms": 200 / 1e6, "host_syncs": 1, "sync_calls": ["cudaStreamSynchronize"],
                        "launches": 2}
    assert found[1] == {"busy_median_ms": 300 / 1e6, "host_syncs": 0, "sync_calls": [], "launches": 2}
    # a trace without runtime activity cannot count synchronisations or launches: unknown, not zero
    blind = summarize_calls(_call(0, 1000, 800, [(10, 110)], [], launches=False), [0], 1)
    assert blind[0]["host_syncs"] is None and blind[0]["busy_median_ms"] == 100 / 1e6
    assert blind[0]["launches"] is None
    with pytest.raises(TimingError, match="found 1 call ranges in the trace for 2 calls"):
        summarize_calls(candidate, [0, 1], 2)


def test_a_latency_batch_lasts_about_two_milliseconds() -> None:
    assert latency_batch(0.02) == 100 and latency_batch(5.0) == 1 and latency_batch(1e-6) == 1000
    assert latency_batch(0.0) == 1000


def _latency(name: str, median_ms: float, busy_ms: float | None, idle: float | None, syncs: int | None,
             mechanism: str = "latency") -> Measurement:
    samples = [median_ms * (1 + 0.001 * (i % 5 - 2)) for i in range(40)]
    extra = {"busy_median_ms": busy_ms, "idle_fraction": idle, "host_syncs": syncs}
    return Measurement.from_samples(samples, warmup=3, mechanism=mechanism, regime="sustained", l2_mode="warm",
                                    label=name, extra=extra)


def test_a_pair_that_idles_the_device_is_judged_on_latency_and_says_why() -> None:
    """The Liger cross entropy of issue 47: its kernels take 78 % of torch.compile's, but it synchronises with
    the host inside the call and the device sits idle 23 % of it; end to end it is 2.5 % slower."""
    c = compare(_latency("liger", 2.15, 1.66, 0.23, 2), _latency("compile", 2.10, 2.13, 0.01, 0),
                method="paired-bootstrap")
    assert c.ratio == pytest.approx(2.15 / 2.10, rel=1e-3) and c.busy_ratio == pytest.approx(1.66 / 2.13)
    assert not c.faster_by_at_least(0.05)
    line = c.disagreement(0.05)
    assert "by busy time alone (kernel time only) the ratio is 0.7793, which would pass" in line
    assert "the verdict follows the latency" in line and "liger: 23% idle, host syncs: 2" in line
    assert "compile:" not in line  # a side with nothing to say is not named
    assert "liger: 23% idle, host syncs: 2" in c.describe()
    # agreement says nothing more; a busy-time mechanism is labelled, and never "disagrees" with itself
    fast = compare(_latency("a", 1.0, 1.0, 0.0, 0), _latency("b", 2.0, 2.0, 0.0, 0), method="paired-bootstrap")
    assert fast.disagreement(0.05) == "" and fast.idle_text() == ""
    kernels = compare(_latency("a", 1.0, None, None, None, "cupti"), _latency("b", 2.0, None, None, None, "cupti"),
                      method="paired-bootstrap")
    assert "cupti: kernel time only" in kernels.describe() and kernels.disagreement(0.05) == ""


PAIR_TEST = """
import pytest
from pytest_ditgate.bench import comparison, fixture
from pytest_ditgate.bench.measurement import Measurement


def side(name, median, busy, idle, syncs):
    samples = [median * (1 + 0.001 * (i % 5 - 2)) for i in range(40)]
    return Measurement.from_samples(samples, warmup=3, mechanism="latency", regime="sustained", l2_mode="warm",
                                    label=name, extra={"busy_median_ms": busy, "idle_fraction": idle,
                                                       "host_syncs": syncs})


@pytest.fixture
def fake_gpu(monkeypatch):
    # what measure_pair returns on a GPU for a candidate that synchronises inside the call
    def measure_pair(candidate, reference, *args, labels=("candidate", "reference"), **opts):
        return comparison.compare(side(labels[0], 2.15, 1.66, 0.23, 2), side(labels[1], 2.10, 2.13, 0.01, 0),
                                  method="paired-bootstrap")
    monkeypatch.setattr(fixture, "measure_pair", measure_pair)


def test_pair(ditbench, fake_gpu):  # stand-ins that return nothing: only the timing is faked, so nothing to verify
    ditbench.pair(lambda: None, lambda: None, min_speedup=0.05, verify=False)
"""


def test_ditbench_pair_fails_a_candidate_whose_kernels_alone_look_faster(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_pair=PAIR_TEST)
    result = pytester.runpytest("--ditgate", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*[[]too_slow[]]*candidate is not faster than the reference by at least 5.0%*"])
    text = result.stdout.str()
    assert "by busy time alone (kernel time only) the ratio is 0.7793, which would pass" in text
    assert "candidate: 23% idle, host syncs: 2" in text and "the verdict follows the latency" in text


HOST_TEST = """
from pytest_ditgate import measure


def test_host():
    m = measure(sum, range(1000))
    assert m.mechanism == "wall", m.mechanism_notes
    assert set(m.mechanism_notes) == {"latency", "events", "wall"}
    assert m.mechanism_notes["latency"].startswith("not available: no CUDA device")
    assert "cupti" not in m.mechanism_notes  # auto never takes a busy-time mechanism
"""


def test_on_the_cpu_wall_is_the_mechanism(pytester: pytest.Pytester, no_cuda) -> None:
    pytester.makepyfile(test_host=HOST_TEST)
    pytester.runpytest("--ditgate", "-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_the_judge_rederives_the_latency_a_busy_time_claim_cannot_move() -> None:
    """The judged path: ``ditgate experiment`` re-derives every ratio from the raw samples of the lane's speed
    test. A candidate that waits for the host records a latency ratio of about 1; the busy time it keeps in
    ``extra`` (0.78 of the reference's) and a forged ratio that agrees with it change nothing: the first is
    never read, the second is an integrity failure."""
    from pytest_ditgate.experiment.evidence import rederive

    c = compare(_latency("candidate", 2.15, 1.66, 0.23, 2), _latency("reference", 2.10, 2.13, 0.01, 0),
                method="paired-bootstrap")
    record = {"test": "tests/test_lane.py::test_speed", "comparison": c.to_dict()}
    derived, why = rederive(record)
    assert why is None and derived["ratio"] == pytest.approx(c.ratio) and derived["mechanism"] == "latency"
    assert derived["ci_high"] > 0.95  # no speed claim survives
    forged = {**record, "comparison": {**c.to_dict(), "ratio": c.busy_ratio}}
    derived, why = rederive(forged)
    assert derived is None and "is not the ratio of its samples" in why


def test_the_summary_line_names_the_idle_side_and_the_disagreement() -> None:
    from pytest_ditgate.bench.report import comparison_row, summary_lines

    c = compare(_latency("liger", 2.15, 1.66, 0.23, 2), _latency("compile", 2.10, 2.13, 0.01, 0),
                method="paired-bootstrap")
    lines = summary_lines([comparison_row("t.py::test_ce", c, 0.05, False)])
    assert lines[0].startswith("test_ce: liger / compile ratio 1.0238") and "(paired-bootstrap, latency, cpu)" in lines[0]
    assert lines[0].endswith("FAIL; liger: 23% idle, host syncs: 2")
    assert lines[1].strip().startswith("by busy time alone (kernel time only) the ratio is 0.7793, which would pass")
    kernels = compare(_latency("a", 1.0, None, None, None, "cupti"), _latency("b", 2.0, None, None, None, "cupti"),
                      method="paired-bootstrap")
    assert "cupti: kernel time only" in summary_lines([comparison_row("t.py::test_k", kernels, 0.05, True)])[0]


def test_a_call_with_no_device_work_says_it_runs_on_the_host() -> None:
    """On a GPU host, a call that launches nothing (a model on the CPU) has busy time 0 and the device idle for
    all of its latency: the line says it runs on the host, not "100% idle"."""
    from pytest_ditgate.bench.comparison import idle_line

    assert idle_line({"busy_median_ms": 0.0, "idle_fraction": 1.0, "host_syncs": 0}) == \
        "no device work (it runs on the host)"
    assert idle_line({"busy_median_ms": 1.66, "idle_fraction": 0.23, "host_syncs": 2}) == "23% idle, host syncs: 2"


class _OnCuda:
    """Stands in for a CUDA tensor (this machine may have none)."""

    is_cuda = True
    device = "cuda:0"


def test_a_cuda_tensor_is_found_wherever_a_call_keeps_it() -> None:
    """In its arguments, nested containers, an output object's attributes, a closure, a partial, a bound method's
    module: a call that holds a CUDA tensor is a device call without tracing it."""
    import functools

    from pytest_ditgate.bench.timers import holds_cuda_tensor

    gpu = _OnCuda()

    class Output:
        def __init__(self, sample):
            self.sample = sample

    class Module:
        def __init__(self, weight):
            self.weight = weight

        def parameters(self):
            return iter([self.weight])

        def buffers(self):
            return iter([])

        def forward(self, x):
            return x

    def closure():
        return gpu

    assert all(holds_cuda_tensor(v) for v in (gpu, (1, [gpu]), {"out": gpu}, Output(gpu), closure,
                                               functools.partial(print, gpu), Module(gpu), Module(gpu).forward))
    host = type("Host", (), {"is_cuda": False, "device": "cpu"})()
    assert not any(holds_cuda_tensor(v) for v in (host, (host, [host]), Output(host), sum, "cuda", None, 3.0,
                                                   Module(host).forward))


def test_a_traced_run_without_device_work_is_the_hosts() -> None:
    from pytest_ditgate.bench.timers import runs_on_host

    assert runs_on_host([{"busy_median_ms": 0.0, "launches": 0}, {"busy_median_ms": 0.0, "launches": None}])
    assert not runs_on_host([{"busy_median_ms": 0.0, "launches": 0}, {"busy_median_ms": 0.2, "launches": 3}])
    assert not runs_on_host([{"busy_median_ms": 0.0, "launches": 1}])  # a launch whose kernel the trace missed
    assert not runs_on_host([])


def test_on_a_gpu_host_a_call_without_device_work_is_timed_by_the_host_clock(monkeypatch) -> None:
    """A CPU function on a machine with a GPU: no CUDA tensor in its arguments or output, and a traced run shows
    no device work, so ``auto`` takes ``wall`` (a judged lane then holds its gains to the host's noise floor);
    one whose trace shows kernels is left to the device mechanisms."""
    from pytest_ditgate import measure
    from pytest_ditgate.bench import runner, timers

    traced: list[int] = []

    def trace(calls):
        traced.append(len(calls))
        return [{"busy_median_ms": 0.0, "host_syncs": 0, "sync_calls": [], "launches": 0} for _ in calls]

    monkeypatch.setattr(timers, "cuda_in_use", lambda: True)
    monkeypatch.setattr(timers, "synchronize", lambda: None)
    monkeypatch.setattr(timers, "trace_calls", trace)
    m = measure(sum, range(1000))
    assert m.mechanism == "wall" and m.arch == "cpu" and traced == [1], m.mechanism_notes
    assert m.mechanism_notes["latency"] == "not used: the call launches no device work"
    # a trace with kernels: the device mechanisms are tried (not run here: this machine may have no GPU)
    monkeypatch.setattr(timers, "trace_calls", lambda calls: [{"busy_median_ms": 0.4, "launches": 2}])
    assert runner._trace_for_auto([timers.Call(sum, (range(10),))]) == ([{"busy_median_ms": 0.4, "launches": 2}],
                                                                         False)
    # a call that holds a CUDA tensor is a device call: no trace before timing it
    assert runner._warm_up([timers.Call(lambda x: x, (_OnCuda(),))], 1)[2] is True
    assert runner._warm_up([timers.Call(sum, (range(10),))], 1)[2] is False
