"""measure / measure_pair on the CPU (wall), option validation, and the pure helpers of the GPU timers."""

from __future__ import annotations

import types

import pytest

from pytest_ditgate.bench import graphs, l2, measure, measure_pair, runner
from pytest_ditgate.bench.runner import _schedule
from pytest_ditgate.bench.timers import TimingError, assign_spans, busy_ns, chunk_spans
from pytest_ditgate.errors import DitgateUsageError


def _work(n: int = 300) -> int:
    return sum(range(n))


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
def test_bad_options_are_clear_usage_errors(kwargs, match) -> None:
    with pytest.raises(DitgateUsageError, match=match):
        measure(_work, **{"reps": 3, "warmup": 0, **kwargs})


def test_graph_floor_gap_is_the_smallest_and_overlap_means_nothing_to_subtract() -> None:
    assert graphs.floor_gap_ns([(0, 10), (12, 20), (25, 30), (31, 40)]) == 1
    assert graphs.floor_gap_ns([(0, 10), (5, 20), (25, 30)]) == 0  # two streams: activities overlap
    assert graphs.floor_gap_ns([(0, 10)]) == 0


class _FakeCapture(graphs.CapturedGraph):
    """A capture without CUDA whose replays read ``replay_ms`` per call, one value after another."""

    def __init__(self, *replay_ms: float, floor_ms: float = 0.0, activities: float = 0.0) -> None:
        self.floor_ms, self.activities_per_call, self.count = floor_ms, activities, 100
        self.readings = iter(replay_ms)
        self.graph = types.SimpleNamespace(replay=lambda: None)

    def time_replay(self) -> float:
        return next(self.readings)


class _FakeProbe(graphs.LatencyProbe):
    """A latency probe whose readings (ms per node) come from a list: the device's latency changing."""

    def __init__(self, *latency_ms: float, replay_ms: float = 0.0) -> None:
        self.readings = iter(latency_ms)
        self.capture = types.SimpleNamespace(count=1)
        self.kernel_ms = replay_ms  # one probe replay lasts count x kernel_ms

    def read_ms(self) -> float:
        return next(self.readings)


def test_graph_samples_lose_the_latency_read_beside_them_per_device_activity(monkeypatch) -> None:
    """The device's launch latency jumps between samples (0.1 -> 0.3 us per node); each sample loses the
    mean of the probe readings before and after it, times its activities per call; a floor gap larger
    than the latency (gaps around a memset node) wins."""
    torch = pytest.importorskip("torch")

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)  # the fake replays launch nothing
    # the first reading of each capture sizes the blocks (a cheap probe: one sample per block)
    steady = _FakeCapture(0.01, 0.0104, 0.0108, 0.0108, activities=2.0)
    memset = _FakeCapture(0.03, 0.0300, 0.0300, 0.0300, floor_ms=0.0008, activities=2.0)
    # three readings before the first block (their median), then one after each block; the latency creeps
    # up by less than 0.05 us a block, a change small enough to count as settled
    probe = _FakeProbe(0.0001, 0.0001, 0.0001, 0.0001, 0.0001, 0.00014, 0.00018, 0.0002, 0.0002)
    timed = graphs.time_graphs([steady, memset], [0, 1, 0, 1, 0, 1], probe)
    assert timed.retaken == 0
    assert timed.raw == [[0.0104, 0.0108, 0.0108], [0.03, 0.03, 0.03]]
    assert timed.latency[0] == pytest.approx([0.0001, 0.00012, 0.00019])
    assert timed.samples[0] == pytest.approx([0.0102, 0.01056, 0.01042])
    assert timed.samples[1] == pytest.approx([0.0284] * 3)  # floor 0.8 us > latency: 2 x 0.8 us lost
    record = runner._gap_record(timed, 0, steady)
    assert record["graph_idle"] == "subtracted" and record["raw_median_ms"] == 0.0108
    assert record["activities_per_call"] == 2.0 and record["retaken_blocks"] == 0
    assert record["subtracted_per_call_us"]["median"] == pytest.approx(0.24)
    assert record["launch_latency_us"]["median"] == pytest.approx(0.12)


def test_a_graph_block_during_which_the_latency_changed_is_retaken(monkeypatch) -> None:
    """The latency jumps from 0.2 to 0.4 us per node during the first block: its samples cannot be
    corrected, so the block is replayed again and the retake is kept; blocks hold several samples when
    the probe is long next to a replay (here 2 samples: a reading of two 0.05 ms probe replays, a 1 ms
    replay, share 5 %)."""
    torch = pytest.importorskip("torch")

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    capture = _FakeCapture(0.01, 0.0023, 0.0021, 0.0023, 0.0023, 0.0023, 0.0023, activities=1.0)
    probe = _FakeProbe(0.0002, 0.0002, 0.0002, 0.0004, 0.0004, 0.0004, replay_ms=0.05)
    timed = graphs.time_graphs([capture], [0, 0, 0, 0], probe)
    assert timed.retaken == 1
    assert timed.raw == [[0.0023] * 4]  # the first try of block one (0.0023, 0.0021) was dropped
    assert timed.samples[0] == pytest.approx([0.0019] * 4)
    assert graphs.settled(0.0002, 0.00024) and not graphs.settled(0.0002, 0.0004)


def test_graph_launch_latency_is_kept_with_a_reason_when_the_profiler_fails(monkeypatch) -> None:
    torch = pytest.importorskip("torch")

    def busy(captures):
        raise TimingError("profiler unavailable: RuntimeError: already profiling")

    monkeypatch.setattr(graphs, "measure_floor_gaps", busy)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    probe, note = runner._latency_probe([_FakeCapture()])
    assert probe is None and "not subtracted (profiler unavailable" in note
    timed = graphs.time_graphs([_FakeCapture(0.001, 0.003)], [0, 0], probe)  # no probe: no sizing replay
    assert timed.samples == timed.raw == [[0.001, 0.003]]
    assert runner._gap_record(timed, 0, _FakeCapture()) == {"graph_idle": "kept", "raw_median_ms": 0.002}


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
