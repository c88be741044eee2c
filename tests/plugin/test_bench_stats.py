"""Pure statistics, Measurement JSON round trip and comparison refusals (no pytester, no torch)."""

from __future__ import annotations

import json
import math

import pytest

from pytest_ditgate.bench import Measurement, compare
from pytest_ditgate.bench.ledger import Ledger
from pytest_ditgate.bench.stats import bootstrap_ratio, mann_whitney_ratio, quantile, summarize
from pytest_ditgate.errors import DitgateUsageError


def test_summary_of_known_samples() -> None:
    s = summarize([5.0, 1.0, 4.0, 2.0, 3.0])
    assert (s.n, s.median, s.mean, s.min, s.max) == (5, 3.0, 3.0, 1.0, 5.0)
    assert s.variance == pytest.approx(2.5) and s.stdev == pytest.approx(math.sqrt(2.5))
    assert s.cv == pytest.approx(math.sqrt(2.5) / 3)
    assert (s.q1, s.q3, s.iqr) == (2.0, 4.0, 2.0)
    assert s.p95 == pytest.approx(4.8)
    assert quantile([1, 2, 3, 4], 0.5) == 2.5
    assert summarize([7.0]).stdev == 0.0


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [float("inf")]])
def test_summary_rejects_empty_or_non_finite(bad) -> None:
    with pytest.raises(ValueError):
        summarize(bad)


def test_ratio_intervals_cover_the_truth() -> None:
    base = [1.0 + 0.01 * ((i * 37) % 11) for i in range(40)]
    doubled = [2 * x for x in base]
    for interval in (bootstrap_ratio(doubled, base), bootstrap_ratio(doubled, base, paired=True),
                     mann_whitney_ratio(doubled, base)):
        assert interval.low <= 2.0 <= interval.high and interval.ratio == pytest.approx(2.0, rel=0.01)
        assert interval.high - interval.low < 0.1
    same = bootstrap_ratio(base, list(reversed(base)))
    assert same.low <= 1.0 <= same.high
    assert bootstrap_ratio(doubled, base) == bootstrap_ratio(doubled, base)  # fixed seed: same verdict


def _m(**fields) -> Measurement:
    base = dict(warmup=3, mechanism="graph", regime="sustained", l2_mode="warm", device="NVIDIA H200", arch="sm_90",
                driver="580.1", cuda="13.0", torch="2.11.0")
    base.update(fields)
    samples = base.pop("samples", [0.011, 0.0105, 0.0112, 0.0108])
    return Measurement.from_samples(samples, **base)


def test_measurement_json_round_trip() -> None:
    m = _m(shapes=((16, 256, 1152), (1152,)), dtype="bfloat16", backend="triton", label="ln",
           clocks_start={"sm_clock_mhz": 1980, "power_w": 120.5}, mechanism_notes={"graph": "chosen"},
           extra={"calls_per_replay": 400})
    back = Measurement.from_dict(json.loads(json.dumps(m.to_dict())))
    assert back == m
    assert back.median_ms == pytest.approx(0.01090) and back.n == 4 and back.samples_ms[0] == 0.011


def test_compare_gives_ratio_ci_and_method() -> None:
    a = _m(samples=[1.0, 1.01, 0.99, 1.0, 1.02, 0.98] * 5)
    b = _m(samples=[2.0, 2.02, 1.98, 2.0, 2.04, 1.96] * 5)
    c = compare(a, b)
    assert c.method == "bootstrap" and c.ratio == pytest.approx(0.5)
    assert c.faster_by_at_least(0.4) and not c.faster_by_at_least(0.6) and c.significant
    assert compare(b, a, method="mann-whitney").slower_by_at_least(0.9)


@pytest.mark.parametrize("field,value", [("arch", "sm_86"), ("driver", "550.0"), ("torch", "2.4.0"),
                                         ("mechanism", "events")])
def test_compare_refuses_across_provenance(field: str, value: str) -> None:
    with pytest.raises(DitgateUsageError, match=f"refusing to compare.*{field}"):
        compare(_m(), _m(**{field: value}))


def test_ledger_best_is_per_arch_and_ratio(tmp_path) -> None:
    from pytest_ditgate.bench.comparison import Comparison

    ledger = Ledger(tmp_path / "bench.jsonl")
    for arch, ratio in (("sm_90", 0.8), ("sm_90", 0.7), ("sm_86", 0.5)):
        a, b = _m(arch=arch), _m(arch=arch)
        ledger.record_comparison(Comparison(a, b, ratio, ratio - 0.01, ratio + 0.01, 0.95, "bootstrap"),
                                 test="t::x", lane="default", passed=True)
    best = ledger.best(test="t::x", arch="sm_90", lane="default", driver="580.1", torch="2.11.0")
    assert best["ratio"] == 0.7
    assert ledger.best(test="t::x", arch="sm_90", lane="default", driver="999", torch="2.11.0") is None
