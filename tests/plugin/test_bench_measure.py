"""measure / measure_pair on the CPU (wall), option validation, and the pure helpers of the GPU timers."""

from __future__ import annotations

import pytest

from pytest_ditgate.bench import l2, measure, measure_pair
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


def test_graph_idle_is_scaled_out_per_graph_and_kept_on_a_profiler_failure(monkeypatch) -> None:
    from pytest_ditgate.bench import runner, timers

    fractions = {"a": (0.9, 1.0), "b": (0.5, 2.0)}
    monkeypatch.setattr(timers, "replay_busy_fraction", lambda graph: fractions[graph])
    extras = [{}, {}]
    scaled, note = runner._subtract_graph_idle(["a", "b"], [[1.0, 2.0, 3.0], [4.0]], extras)
    assert scaled == [[0.9, 1.8, 2.7], [2.0]]
    assert extras[0]["raw_median_ms"] == 2.0 and extras[1]["kernels_per_call"] == 2.0
    assert extras[1]["idle_per_call_us"] == pytest.approx(2000.0)
    assert "2000.000 us per call" in note

    def busy(graph):
        raise TimingError("profiler unavailable: RuntimeError: already profiling")

    monkeypatch.setattr(timers, "replay_busy_fraction", busy)
    extras = [{}]
    scaled, note = runner._subtract_graph_idle(["a"], [[1.0]], extras)
    assert scaled == [[1.0]] and extras == [{"graph_idle": "kept"}]
    assert "not subtracted (profiler unavailable" in note


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
