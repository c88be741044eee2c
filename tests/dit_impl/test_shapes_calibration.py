"""The committed contract's shapes limits are the calibration rule applied to the committed measurements."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "shapes_calibration_sm_90.json"
#: the classes benchmark's record of the same case (benchmarks/shapes_classes.py), once measured on a GPU
CLASSES_RESULTS = ROOT / "benchmarks" / "results" / "shapes_classes_sm_90.json"
CPU_CLASSES = ROOT / "benchmarks" / "results" / "shapes_classes_cpu.json"


def quantization_structure() -> dict[str, float]:
    """What the classes benchmark's committed CPU record says an honest quantization needs on the shapes cases."""
    import shapes_classes  # benchmarks/ is on sys.path (load_benchmark)

    return shapes_classes.quantization_structure(json.loads(CPU_CLASSES.read_text()))


@pytest.fixture(scope="module")
def calibration(load_benchmark):
    return load_benchmark("shapes_calibration")


def test_contract_holds_the_derived_limits(calibration) -> None:
    from pytest_ditgate.quality import load_contract

    record = json.loads(RESULTS.read_text())
    limits = calibration.derive_limits(record["stats"], record["raw"], record["images"],
                                         calibration.load_kernel_order())
    contract = load_contract(ROOT / "fixtures" / "quality_contract.toml")
    rules = {(r.metric, r.experiment_class): r for r in contract.rules("numerical") + contract.rules("quantization")
             if r.applies_to(calibration.CASE)}
    if not CLASSES_RESULTS.is_file():  # once measured, the classes record sets the case's learned limits (its test)
        for metric in calibration.LEARNED:
            noise = limits["noise"][metric]
            assert rules[(metric, "quantization")].noise == pytest.approx(noise, rel=1e-3)
            assert rules[(metric, "numerical")].abs == pytest.approx(noise, rel=1e-3)
            approximate = next(r for r in contract.rules("approximate")
                               if r.metric == metric and r.applies_to(calibration.CASE))
            assert approximate.abs == pytest.approx(limits["spread"][metric], rel=1e-3)
        assert rules[("class_accuracy", "numerical")].min == pytest.approx(limits["accuracy_floor"], abs=0.005)
    general = {m: {"numerical": {("min" if m in ("psnr", "ssim", "cosine") else "max"): rules[(m, "numerical")].min
                                 if m in ("psnr", "ssim", "cosine") else rules[(m, "numerical")].max}}
               for m in calibration.PAIR}
    for name, table in calibration.shapes_tables(limits, general).items():
        metric = name.split("@")[0]
        key = "min" if metric in ("psnr", "ssim", "cosine") else "max"
        rule = rules[(metric, "numerical")]
        for dtype in ("fp32", "tf32", "bf16"):
            want, got = table["numerical"][key][dtype], rule.limit(key, dtype)
            assert got == pytest.approx(want, rel=2e-3), (name, dtype)
        # quantization's limits are the loosest of bf16's and what an honest quantization needs (its test)
        loosest = (min if key == "min" else max)(table["quantization"][key], quantization_structure()[metric])
        assert rules[(metric, "quantization")].limit(key, "int8") == pytest.approx(loosest, rel=2e-3)


def test_recorded_transitions_show_every_flip_and_the_harmful_changes_fail() -> None:
    record = json.loads(RESULTS.read_text())
    seen = {item["transition"] for item in record["transitions"]}
    assert seen == {"pass->pass", "pass->fail", "fail->pass", "fail->fail"}
    verdicts = {(item["variant"], item["baseline"]): item["passed"] for item in record["transitions"]}
    assert not verdicts[("erf-gelu", "baseline")] and not verdicts[("dropped-shift", "baseline")]
    honest = ("fast-fp32", "tf32", "bf16", "candidate-bf16", "int8-weights", "steps-25", "steps-10", "dpm-25", "euler-50")
    assert all(verdicts[(name, "baseline")] for name in honest)
    assert record["arch"] == "sm_90" and math.isfinite(record["seconds"])


def test_no_shapes_pixel_limit_passes_the_dropped_shift(calibration) -> None:
    """Every pixel/latent limit the rule sets for the shapes cases can fail: the dropped adaLN shift's worst
    recorded value violates each one, for every dtype (a bound below zero correlation would pass it)."""
    from pytest_ditgate.quality import load_contract

    record = json.loads(RESULTS.read_text())
    broken = record["stats"]["dropped-shift"]
    contract = load_contract(ROOT / "fixtures" / "quality_contract.toml")
    for cls in ("numerical", "quantization"):
        for rule in contract.rules(cls):
            if rule.metric not in calibration.PAIR or not rule.applies_to(calibration.CASE):
                continue
            higher = rule.metric in ("psnr", "ssim", "cosine")
            for dtype in (("fp32", "tf32", "bf16") if cls == "numerical" else ("int8",)):
                limit = rule.limit("min" if higher else "max", dtype)
                worst = broken[rule.metric]["min" if higher else "max"]
                assert (worst < limit) if higher else (worst > limit), (cls, rule.metric, dtype, worst, limit)


def test_every_dtype_below_float32_has_the_loosest_pixel_limits_and_the_h100_tf32_candidate_passes_them() -> None:
    """Below float32 a guided trajectory's divergence is not the dtype's size: the fast DiT in TF32 on an H100
    (benchmarks/results/classes_tf32_h100.json) moved further than the TF32 variant calibrated on the H200.
    Its recorded pixel/latent values pass the contract's tf32 limits, which are bf16's (and fp16's)."""
    from pytest_ditgate.quality import load_contract

    contract = load_contract(ROOT / "fixtures" / "quality_contract.toml")
    measured = json.loads((RESULTS.parent / "classes_tf32_h100.json").read_text())["measured"]
    for rule in contract.rules("numerical"):
        if not rule.applies_to("shapes-ddim-50") or rule.metric not in ("psnr", "ssim", "worst_tile_mae",
                                                                         "rel_l2", "cosine"):
            continue
        key = "min" if rule.metric in ("psnr", "ssim", "cosine") else "max"
        limits = {dtype: rule.limit(key, dtype) for dtype in ("tf32", "fp16", "bf16")}
        assert len(set(limits.values())) == 1, (rule.metric, limits)
        value = next(v for name, v in measured.items() if name.endswith("." + rule.metric))
        assert (value >= limits["tf32"]) if key == "min" else (value <= limits["tf32"]), (rule.metric, value)
