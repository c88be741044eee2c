"""measure / measure_pair on the CPU (wall), option validation, and the pure helpers of the GPU timers."""

from __future__ import annotations


import pytest

from pytest_ditgate.bench import graphs, l2, measure, measure_pair, runner
from pytest_ditgate.bench.runner import _schedule
from pytest_ditgate.bench.timers import TimingError, assign_spans, busy_ns, chunk_spans
from pytest_ditgate.errors import DitgateUsageError

from host_only import no_cuda  # noqa: F401 - a fixture: these tests time on a host without CUDA


def _work(n: int = 300) -> int:
    return sum(range(n))


@pytest.mark.usefixtures("no_cuda")
def test_wall_mechanism_counts_and_provenance() -> None:
    m = measure(_work, 500, mechanism="wall", warmup=2, reps=12, label="w", backend="py", dtype="float32",
                shapes=[[2, 3]])
    assert (m.mechanism, m.regime, m.n, m.warmup, m.l2_mode, m.arch) == ("wall", "spaced", 12, 2, "warm", "cpu")
    assert m.shapes == ((2, 3),) and m.dtype == "float32" and m.calls_per_sample == 1
    assert m.min_ms <= m.median_ms <= m.max_ms and len(m.samples_ms) == 12
    assert m.mechanism_notes["wall"].startswith("chosen (requested)")


def test_budget_bounds_the_sample_count() -> None:
    m = measure(_work, budget_ms=5)
    assert 10 <= m.n <= 1000 and m.mechanism == "wall"


def test_measure_pair_is_interleaved_and_paired() -> None:
    c = measure_pair(lambda: _work(20000), lambda: _work(2000), rounds=15, warmup=1)
    assert c.a.n == c.b.n == 15 and c.method == "paired-bootstrap"
    assert c.slower_by_at_least(1.0) and c.a.label == "candidate" and c.b.label == "reference"
    assert _schedule(2, 4) == [0, 1, 1, 0, 0, 1, 1, 0]
    assert _schedule(1, 3) == [0, 0, 0]


@pytest.mark.parametrize("kwargs,match", [
    ({"mechanism": "nvtx"}, "mechanism='nvtx'"),
    ({"l2": "tepid"}, "l2='tepid'"),
    ({"reps": 1}, "reps must be >= 2"),
    ({"regime": "bursty"}, "regime='bursty'"),
    ({"graph_idle": "sometimes"}, "graph_idle='sometimes'"),
    ({"l2": "cold"}, "needs a CUDA device"),
    ({"mechanism": "graph"}, "graph: not available: no CUDA device"),
])
@pytest.mark.usefixtures("no_cuda")
def test_bad_options_are_clear_usage_errors(kwargs, match) -> None:
    with pytest.raises(DitgateUsageError, match=match):
        measure(_work, **{"reps": 3, "warmup": 0, **kwargs})


def test_graph_floor_gap_is_the_smallest_and_overlap_means_nothing_to_subtract() -> None:
    assert graphs.floor_gap_ns([(0, 10), (12, 20), (25, 30), (31, 40)]) == 1
    assert graphs.floor_gap_ns([(0, 10), (5, 20), (25, 30)]) == 0  # two streams: activities overlap
    assert graphs.floor_gap_ns([(0, 10)]) == 0


class _FakeCapture(graphs.CapturedGraph):
    """A capture without CUDA: queued replays read ``replay_ms`` per call one after another, and a traced
    queued replay shows ``spans``."""

    def __init__(self, *replay_ms: float, spans: list[tuple[int, int]] | None = None) -> None:
        self.floor_ms, self.activities_per_call, self.count = 0.0, 0.0, 3
        self.readings, self.spans = iter(replay_ms), spans or []

    def time_replay(self) -> float:
        return next(self.readings)

    def queued_spans(self) -> list[tuple[int, int]]:
        return self.spans


def test_graph_samples_take_the_captures_in_turn_and_lose_their_floor_gap_per_activity(monkeypatch) -> None:
    """Two activities per call (a memset and a kernel); the smallest gap between them in a capture's traced
    queued replay (1.0 us in one capture, 0.7 us in the other) less the 0.2 us that tracing alone puts
    between nodes is taken off twice per call of its samples."""
    monkeypatch.setattr(graphs, "tracing_floor_ms", lambda: 0.0002)
    spans = [(0, 1000), (2000, 5000), (6200, 7000), (8200, 11000), (12100, 13000), (14200, 17000)]
    first = _FakeCapture(*(0.03,) * 3, 0.0300, 0.0300, spans=spans)
    second = _FakeCapture(*(0.03,) * 3, 0.0302, spans=[(0, 1000), (1700, 5000)] + spans[2:])
    plain = _FakeCapture(*(0.01,) * 3, 0.0100, 0.0101, 0.0102)
    memset_set, plain_set = graphs.GraphSet([first, second]), graphs.GraphSet([plain])
    assert "tracing floor 0.200 us, up to 1.600 us per call" in graphs._floor_note([first, second])
    raw = graphs.time_graphs([memset_set, plain_set], [0, 1, 1, 0, 0, 1])
    assert raw == [[0.03, 0.0302, 0.03], [0.01, 0.0101, 0.0102]]  # the memset call's captures in turn
    samples = graphs.without_floor_gaps([memset_set, plain_set], raw)
    assert samples[0] == pytest.approx([0.0284, 0.0292, 0.0284])
    assert samples[1] == raw[1]  # floor not measured: nothing to take off
    record = graphs._gap_record(raw[0], memset_set)
    assert record == {"graph_idle": "subtracted", "raw_median_ms": 0.03, "activities_per_call": 2.0,
                      "floor_gap_us": pytest.approx([0.8, 0.5]), "subtracted_per_call_us": pytest.approx([1.6, 1.0])}


def test_graph_idle_is_kept_with_a_reason_when_the_profiler_fails(monkeypatch) -> None:
    capture = _FakeCapture(*(0.001,) * 3, 0.001, 0.003)

    def busy() -> list:
        raise TimingError("profiler unavailable: RuntimeError: already profiling")

    monkeypatch.setattr(graphs, "tracing_floor_ms", busy)
    assert "not subtracted (profiler unavailable" in graphs._floor_note([capture])
    sets = [graphs.GraphSet([capture])]
    raw = graphs.time_graphs(sets, [0, 0])
    assert graphs.without_floor_gaps(sets, raw) == raw == [[0.001, 0.003]]
    assert graphs._gap_record(raw[0], sets[0]) == {"graph_idle": "kept", "raw_median_ms": 0.002}


def test_too_few_traced_activities_for_the_calls_is_a_timing_error(monkeypatch) -> None:
    monkeypatch.setattr(graphs, "tracing_floor_ms", lambda: 0.0)
    with pytest.raises(TimingError, match="recorded 1 device activities for 3 calls"):
        graphs.measure_floor_gaps([_FakeCapture(spans=[(0, 10)])])


def test_spans_are_grouped_by_call_range_and_union_counts_busy_time() -> None:
    ranges = [(0, 100), (200, 300)]
    spans = [(10, 20), (15, 30), (50, 60), (210, 250)]
    groups = assign_spans(ranges, spans)
    assert groups == [[(10, 20), (15, 30), (50, 60)], [(210, 250)]]
    assert busy_ns(groups[0]) == 30  # 10..30 and 50..60; the idle gap 30..50 is not counted
    assert chunk_spans([(0, 1), (2, 3), (4, 5), (6, 7)], 2) == [[(0, 1), (2, 3)], [(4, 5), (6, 7)]]
    with pytest.raises(TimingError, match="do not divide"):
        chunk_spans([(0, 1), (2, 3), (4, 5)], 2)


def test_cold_l2_sizes_from_the_real_l2() -> None:
    six_mb = 6 * 2**20
    assert l2.flush_bytes(six_mb) == 12 * 2**20
    copies = l2.rotation_count(2**20, six_mb)
    assert copies * 2**20 >= l2.flush_bytes(six_mb) and copies == 13
    with pytest.raises(ValueError, match="has none"):
        l2.rotation_count(0, six_mb)
    with pytest.raises(ValueError, match="do not fit"):
        l2.rotation_count(2**20, six_mb, free_bytes=4 * 2**20)


def test_an_error_of_the_timed_code_inside_the_profiler_is_its_own_not_the_profiler_s() -> None:
    """A call that raises while traced keeps its exception (a bug or CUDA OOM is not "profiler unavailable");
    a profiler that cannot start is a TimingError (here: no CUDA, so no device activity to trace)."""
    torch = pytest.importorskip("torch")
    from pytest_ditgate.bench import timers

    def buggy() -> None:
        raise ValueError("the kernel wrapper has a bug")

    with pytest.raises(ValueError, match="the kernel wrapper has a bug"):
        timers.profiled(buggy, host=True)
    if not torch.cuda.is_available():
        with pytest.raises(TimingError, match="profiler unavailable"):
            timers.profiled(lambda: None)
