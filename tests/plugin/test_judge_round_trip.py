"""The judge's round trip per timed call (``rounds.RegionTiming.round_trip``): where it outweighs the work of both
the candidate and the best, a gain reads diluted, and the timing record says so and how to sharpen it."""

from __future__ import annotations

import re

import pytest

from pytest_ditgate.experiment.rounds import RegionTiming


def _region(candidate_ms: float, best_ms: float, warm: dict[str, float]) -> RegionTiming:
    rounds = 16
    return RegionTiming("forward", calls=4, warm_ms=warm,
                        samples={"candidate": [candidate_ms * (1 + 0.01 * (i % 3)) for i in range(rounds)],
                                 "best": [best_ms * (1 + 0.01 * (i % 3)) for i in range(rounds)],
                                 "baseline": [best_ms] * rounds})


def test_a_round_trip_longer_than_the_work_is_named_with_the_remedy() -> None:
    """The H100 host's case: an honest quarter of the work (0.1 ms against 0.3 ms) under a 1.2-ms round trip
    reads 0.87 instead of 0.33."""
    trip, note = _region(1.3, 1.5, {"candidate": 0.1, "best": 0.3, "baseline": 0.3}).round_trip()
    assert trip == pytest.approx(1.2, rel=0.02)
    assert note is not None and "0.1 to 0.3 ms of work" in note and re.search(r"about 1\.2\d* ms per call", note)
    assert "give each call more work" in note


def test_work_that_outweighs_the_round_trip_needs_no_note() -> None:
    trip, note = _region(1.6, 4.6, {"candidate": 1.1, "best": 4.1, "baseline": 4.1}).round_trip()
    assert trip == pytest.approx(0.5, rel=0.05) and note is None
    # a round that ran faster than its warm-up: no negative round trip
    assert _region(0.9, 0.9, {"candidate": 1.0, "best": 1.0, "baseline": 1.0}).round_trip() == (0.0, None)
    # nothing measured: nothing said
    assert RegionTiming("forward").round_trip() == (None, None)
