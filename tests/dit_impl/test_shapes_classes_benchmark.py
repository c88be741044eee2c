"""benchmarks/shapes_classes.py: the rule that sets a shapes case's learned-metric limits from the baseline's own
spread over seeds, the verdicts it gives each variant, and the committed contract holding what the rule gives on
the committed measurements."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
#: the committed records, by case: the CPU's 10-image case, and the GPU's 200-image case once it is measured
RECORDS = {"shapes-ddim-20": RESULTS / "shapes_classes_cpu.json", "shapes-ddim-50": RESULTS / "shapes_classes_sm_90.json"}


@pytest.fixture(scope="module")
def classes(load_benchmark):
    return load_benchmark("shapes_classes")


def test_the_rule_on_made_up_measurements(classes) -> None:
    raw = {"default": {"class_accuracy": [0.9, 1.0, 0.9, 1.0], "frechet_distance": [100.0, 110.0, 90.0, 100.0]},
           "fast:dtype=bfloat16": {"class_accuracy": [0.9, 0.9, 0.9, 1.0], "frechet_distance": [101, 112, 91, 99]},
           "steps=5": {"class_accuracy": [0.9, 1.0, 0.9, 0.9], "frechet_distance": [104, 111, 95, 103]},
           "steps=1": {"class_accuracy": [0.3, 0.4, 0.2, 0.3], "frechet_distance": [300, 320, 310, 290]}}
    limits = classes.derive(raw, images=10)
    sigma = math.sqrt(0.95 * 0.05 / 10)  # the binomial error beats the measured 0.0577
    assert limits["sigma"]["class_accuracy"] == pytest.approx(max(sigma, 0.057735), rel=1e-4)
    assert limits["spread"]["frechet_distance"] == pytest.approx(2 * math.sqrt(2) * 8.16497, rel=1e-4)
    assert limits["noise"]["class_accuracy"] == pytest.approx(2 * math.sqrt(0.01 / 4), rel=1e-6)
    assert limits["noise"]["frechet_distance"] == pytest.approx(2 * math.sqrt((1 + 4 + 1 + 1) / 4), rel=1e-6)
    assert limits["accuracy_floor"] == pytest.approx(0.95 - limits["spread"]["class_accuracy"])
    assert limits["false_refusal_per_metric"] == pytest.approx(0.02275, abs=1e-5)
    assert 0 <= limits["measured_false_refusal"] <= 1
    verdicts = classes.verdicts(raw, limits)
    assert verdicts["steps=5"]["class"] == "approximate" and verdicts["steps=5"]["verdict"] == "accepted"
    assert verdicts["steps=1"]["verdict"] == "refused" and verdicts["steps=1"]["case_seed"].startswith("refused:")
    assert verdicts["fast:dtype=bfloat16"]["class"] == "numerical"
    assert classes.variant_class("fast:quant=fp8") == "quantization"
    assert classes.variant_class("fast:dtype=bfloat16,quant=none") == "numerical"


def _rules(case: str) -> dict[tuple[str, str], object]:
    from pytest_ditgate.quality import load_contract

    contract = load_contract(ROOT / "fixtures" / "quality_contract.toml")
    return {(rule.metric, cls): rule for cls in ("numerical", "approximate", "quantization")
            for rule in contract.rules(cls) if rule.applies_to(case) and rule.spec.needs == "classifier"}


@pytest.mark.parametrize("case", sorted(RECORDS))
def test_the_contract_holds_the_limits_the_rule_gives_on_the_committed_data(classes, case) -> None:
    if not RECORDS[case].is_file():
        pytest.skip(f"{RECORDS[case].name} is not measured yet (a GPU run: benchmarks/README.md)")
    record = json.loads(RECORDS[case].read_text())
    assert record["case"] == case
    limits = classes.derive(record["raw"], record["images_per_set"])
    rules = _rules(case)
    for metric in classes.LEARNED:
        assert rules[(metric, "approximate")].abs == pytest.approx(limits["spread"][metric], rel=1e-3), metric
        assert rules[(metric, "numerical")].abs == pytest.approx(limits["noise"][metric], rel=1e-3), metric
        assert rules[(metric, "quantization")].noise == pytest.approx(limits["noise"][metric], rel=1e-3), metric
    for cls in ("numerical", "approximate", "quantization"):
        assert rules[("class_accuracy", cls)].min == pytest.approx(limits["accuracy_floor"], abs=1e-3), cls


def test_quantizations_structure_limits_pass_honest_quantization_and_catch_gross_breakage(classes) -> None:
    """On the shapes cases quantization's pixel/latent limits are the loosest of bf16's numerical ones and 2x the
    worst error of the quantizations the learned metrics accept (fp8 GEMMs, int8 weights); int4 without scales,
    refused by the learned metrics, fails them too (its noise-like images leave the worst tile's error near
    bf16's limit; PSNR, rel-L2 and cosine see it)."""
    record = json.loads(RECORDS["shapes-ddim-20"].read_text())
    structure = classes.quantization_structure(record)
    from pytest_ditgate.quality import load_contract

    contract = load_contract(ROOT / "fixtures" / "quality_contract.toml")
    numerical = {r.metric: r for r in contract.rules("numerical") if r.applies_to("shapes-ddim-20") and r.spec.pair}
    quantization = {r.metric: r for r in contract.rules("quantization") if r.applies_to("shapes-ddim-20")
                    and r.spec.pair and r.metric in structure}
    assert set(quantization) == set(structure)
    broken, caught = record["raw"]["fast:quant=int4_noscale"], set()
    for metric, rule in quantization.items():
        higher = metric in classes.HIGHER
        key = "min" if higher else "max"
        loosest = (min if higher else max)(numerical[metric].limit(key, "bf16"), structure[metric])
        assert rule.limit(key, "fp32") == pytest.approx(loosest, rel=2e-3), metric
        worst = (min if higher else max)(broken[metric])
        if (worst < rule.limit(key, "fp32")) if higher else (worst > rule.limit(key, "fp32")):
            caught.add(metric)
    assert caught >= {"psnr", "rel_l2", "cosine"}, caught
    assert record["verdicts"]["fast:quant=fp8"]["verdict"] == "accepted"
    assert record["verdicts"]["fast:quant=int4_noscale"]["verdict"] == "refused"


def test_the_cpu_record_places_the_classes_candidates(classes) -> None:
    """What the classes stage's approximate candidates rest on: at the case's seed (what the lane judges) and over
    the seed sets, 4 of 20 steps (step_fraction 0.2) are accepted and 2 steps refused."""
    verdicts = json.loads(RECORDS["shapes-ddim-20"].read_text())["verdicts"]
    assert verdicts["steps=4"]["verdict"] == "accepted" and verdicts["steps=4"]["case_seed"] == "accepted"
    assert verdicts["steps=2"]["verdict"] == "refused" and verdicts["steps=2"]["case_seed"].startswith("refused")
    assert verdicts["fast:dtype=bfloat16"]["verdict"] == "accepted"  # the honest dtype the noise comes from
