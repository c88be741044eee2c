"""benchmarks/shapes_steps.py: a paired difference is called worse only when its whole interval is on the worse
side, and a small CPU run writes a record and a table with every step count judged against the first."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def steps_benchmark(load_benchmark):
    return load_benchmark("shapes_steps")


def test_the_paired_interval_is_a_t_interval_of_the_differences(steps_benchmark) -> None:
    interval = steps_benchmark.paired_interval([2.0, 3.0, 4.0], [1.0, 1.0, 1.0])  # differences 1, 2, 3
    half = 4.303 * 1.0 / 3 ** 0.5
    assert interval == pytest.approx({"mean": 2.0, "low": 2.0 - half, "high": 2.0 + half})


@pytest.mark.parametrize(("metric", "low", "high", "expected"), [
    ("frechet_distance", 0.7, 2.1, "worse"),      # higher distance, the whole interval above zero
    ("frechet_distance", -0.4, 0.2, "same"),
    ("frechet_distance", -2.0, -0.1, "better"),
    ("class_accuracy", -0.02, -0.001, "worse"),   # lower accuracy
    ("class_accuracy", -0.02, 0.0006, "same"),    # touches zero: not measurably worse
    ("class_accuracy", 0.001, 0.01, "better"),
])
def test_worse_means_the_whole_interval_is_on_the_worse_side(steps_benchmark, metric, low, high, expected) -> None:
    assert steps_benchmark.verdict(metric, {"mean": (low + high) / 2, "low": low, "high": high}) == expected


def test_a_cpu_run_records_every_step_count_against_the_first(steps_benchmark, tmp_path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    target = tmp_path / "steps.json"
    assert steps_benchmark.main(["--json", str(target), "--device", "cpu", "--seeds", "2", "--repeat", "1",
                                 "--steps", "3,1"]) == 0
    record = json.loads(target.read_text())
    assert record["steps"] == [3, 1] and record["images_per_set"] == 10 and len(record["seed_sets"]) == 2
    assert set(record["summary"]["1"]["class_accuracy"]) == {"mean", "std", "paired", "verdict"}
    assert "paired" not in record["summary"]["3"]["frechet_distance"]
    table = target.with_suffix(".txt").read_text()
    assert "reference" in table and record["device"] in table
