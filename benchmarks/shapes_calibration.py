#!/usr/bin/env python3
"""Calibrate the quality contract on the trained shapes model: measure, derive limits, show the flips.

    python3 benchmarks/shapes_calibration.py --json benchmarks/results/shapes_calibration_sm_90.json

At the corpus case ``shapes-ddim-50`` (200 images, DDIM 50, guidance 4), for several seed sets, sample
the float32 baseline (TF32 off) and each variant beside it: honest numerical changes (the fast DiT in
float32, TF32, bf16, the lane's bf16 candidate), approximate ones (25 and 10 steps, DPM-Solver++ 25,
Euler 50), int8 weight-only quantization, and harmful changes (the erf-for-tanh GELU swap, a dropped
adaLN shift). Every variant gets the pixel/latent metrics against the baseline of the same seeds and
the learned metrics (class accuracy, Frechet distance). From these distributions the rule of
``derive_limits`` (docs/quality_calibration.md) gives the contract's limits; the variants are then judged
with those limits (the baseline -> candidate transitions), and everything is written with provenance.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

CASE = "shapes-ddim-50"
#: variant -> (dtype key of its compute, experiment class it claims)
VARIANTS = {
    "baseline": ("fp32", "numerical"), "fast-fp32": ("fp32", "numerical"), "tf32": ("tf32", "numerical"),
    "bf16": ("bf16", "numerical"), "candidate-bf16": ("bf16", "numerical"),
    "steps-25": ("fp32", "approximate"), "steps-10": ("fp32", "approximate"),
    "dpm-25": ("fp32", "approximate"), "euler-50": ("fp32", "approximate"),
    "int8-weights": ("int8", "quantization"),
    "erf-gelu": ("fp32", "numerical"), "dropped-shift": ("fp32", "numerical"),
}
HONEST_NUMERICAL = {"fp32": ["fast-fp32"], "tf32": ["tf32"], "bf16": ["bf16", "candidate-bf16"]}
#: the float32 kernel-order record (``--kernel-order``): the fast DiT in float32 on the CPU, another
#: reduction order than the baseline's, on the CPU case; its worst values join the float32 limits
KERNEL_ORDER = ROOT / "benchmarks" / "results" / "shapes_kernel_order_cpu.json"
KERNEL_ORDER_CASE = "shapes-ddim-20"
HARMFUL = ["erf-gelu", "dropped-shift"]
PAIR = ("psnr", "ssim", "worst_tile_mae", "rel_l2", "cosine")
LEARNED = ("class_accuracy", "frechet_distance")


def build_variants(device: str) -> dict[str, tuple[Any, dict[str, Any], Callable[[], Any]]]:
    """name -> (model, sampling overrides, context manager factory)."""
    from dit_impl.baseline import load_model
    from dit_impl.fast.candidate import options_for
    from dit_impl.fast.options import FastOptions
    from dit_impl.fast.sampling import fast_model
    from dit_impl.shapes.variants import dropped_shift, erf_gelu, int8_weight_only, tf32

    base32 = load_model("dit-s-shapes", dtype="float32", device=device)
    base16 = load_model("dit-s-shapes", dtype="bfloat16", device=device)
    fast32 = fast_model(base32, FastOptions(dtype="float32", sdpa="math" if device == "cpu" else "auto"))
    candidate = fast_model(base16, options_for(device.split(":")[0]))
    plain = contextlib.nullcontext

    return {
        "baseline": (base32, {}, plain), "fast-fp32": (fast32, {}, plain), "tf32": (base32, {}, lambda: tf32(True)),
        "bf16": (base16, {}, plain), "candidate-bf16": (candidate, {}, plain),
        "steps-25": (base32, {"steps": 25}, plain), "steps-10": (base32, {"steps": 10}, plain),
        "dpm-25": (base32, {"steps": 25, "scheduler": "dpm-multistep"}, plain),
        "euler-50": (base32, {"scheduler": "euler"}, plain),
        "int8-weights": (int8_weight_only(base32), {}, plain), "erf-gelu": (erf_gelu(base32), {}, plain),
        "dropped-shift": (fast32, {}, dropped_shift),
    }


def sample_images(model: Any, kwargs: dict[str, Any], context: Callable[[], Any]) -> tuple[Any, Any]:
    """(images in [0, 1], final latents) as float32 on the CPU."""
    from dit_impl.fast.sampling import sample
    from dit_impl.shapes.variants import tf32

    with tf32(False), context():
        result = sample(model, **kwargs)
    return result.images.float().cpu(), result.latents.float().cpu()


def pair_metrics(images: Any, latents: Any, ref_images: Any, ref_latents: Any) -> dict[str, float]:
    from harness import cosine_similarity, psnr_per_image, rel_l2, ssim_per_image, worst_tile_mae_per_image

    return {"psnr": float(psnr_per_image(images, ref_images).min()),
            "ssim": float(ssim_per_image(images, ref_images).min()),
            "worst_tile_mae": float(worst_tile_mae_per_image(images, ref_images, 16).max()),
            "rel_l2": rel_l2(latents, ref_latents), "cosine": cosine_similarity(latents, ref_latents)}


def learned_metrics(scorer: Any, images: Any, labels: list[int]) -> dict[str, float]:
    from harness import class_accuracy, frechet_distance

    return {"class_accuracy": class_accuracy(scorer, images, labels),
            "frechet_distance": frechet_distance(scorer, images)}


def summarise(values: list[float]) -> dict[str, float]:
    finite = [v for v in values if math.isfinite(v)]
    return {"mean": statistics.fmean(finite) if finite else float("inf"),
            "std": statistics.stdev(finite) if len(finite) > 1 else 0.0,
            "min": min(values), "max": max(values), "n": len(values)}


def derive_limits(stats: dict[str, dict[str, dict[str, float]]], raw: dict[str, dict[str, list[float]]],
                  images: int, kernel_order: dict[str, Any] | None = None) -> dict[str, Any]:
    """The contract's limits from the measured distributions (the rule docs/quality_calibration.md states).

    * learned metrics, two noise bands:
      ``noise`` (paired) = 2 x the RMS difference from the baseline, on the same seeds, of the honest
      non-float32 variants (TF32, bf16, the lane's candidate): how far a change that keeps the sampler
      moves a learned metric. numerical may regress by at most that (``abs``), quantization too (``noise``:
      zero regression within seed noise);
      ``spread`` (unpaired) = 2 x sqrt(2) x the baseline's seed-to-seed standard deviation (for accuracy
      never below the binomial standard error of ``images`` samples): the difference of two independent
      draws, what a change of the sampler (steps, scheduler) may move a metric. approximate's ``abs``;
    * class accuracy's floor (judged on the baseline too) is the baseline's mean less one ``spread``, at
      most 0.9 (the target for samples at the baseline setting);
    * numerical pixel/latent limits per dtype: the worst value over the honest variants of that dtype and
      all seed sets, widened 2x in error (PSNR 6 dB lower; SSIM and cosine 2x further from 1, but never
      below 0: a bound under zero correlation passes anything, the dropped shift included). float32's
      honest variants are the fast DiT on the GPU and, from ``kernel_order``, on the CPU: guided sampling
      amplifies a float32 reduction-order difference, and a float32 limit must not reject one.
    """
    base = stats["baseline"]
    honest = {dtype: list(names) for dtype, names in HONEST_NUMERICAL.items()}
    if kernel_order is not None:
        stats = {**stats, "fast-fp32@kernel-order": kernel_order["stats"]["fast-fp32"]}
        honest["fp32"].append("fast-fp32@kernel-order")
    paired = [name for dtype, names in HONEST_NUMERICAL.items() if dtype != "fp32" for name in names]
    noise, spread = {}, {}
    for metric in LEARNED:
        differences = [value - ref for name in paired for value, ref in zip(raw[name][metric], raw["baseline"][metric])]
        noise[metric] = 2 * math.sqrt(statistics.fmean(d * d for d in differences))
        sigma = base[metric]["std"]
        if metric == "class_accuracy":
            p = base[metric]["mean"]
            sigma = max(sigma, math.sqrt(p * (1 - p) / images))
        spread[metric] = 2 * math.sqrt(2) * sigma
    numerical: dict[str, dict[str, float]] = {}
    for dtype, names in honest.items():
        worst = {metric: [stats[n][metric]["min" if metric in ("psnr", "ssim", "cosine") else "max"] for n in names]
                 for metric in PAIR}
        numerical[dtype] = {
            "psnr": min(worst["psnr"]) - 6.0, "ssim": max(0.0, 1 - 2 * (1 - min(worst["ssim"]))),
            "worst_tile_mae": 2 * max(worst["worst_tile_mae"]), "rel_l2": 2 * max(worst["rel_l2"]),
            "cosine": max(0.0, 1 - 2 * (1 - min(worst["cosine"])))}
    floor = min(0.9, base["class_accuracy"]["mean"] - spread["class_accuracy"])
    return {"noise": noise, "spread": spread, "accuracy_floor": floor, "numerical": numerical}


IDEAL = {"psnr": math.inf, "ssim": 1.0, "cosine": 1.0, "worst_tile_mae": 0.0, "rel_l2": 0.0}
#: the tightest float32 limits the rule will set: another float32 kernel order (a different SDPA backend,
#: a fused epilogue) may differ by this much, and an fp32 limit must not reject it
FP32_FLOOR = {"psnr": 90.0, "ssim": 0.99999, "cosine": 1 - 1e-9, "worst_tile_mae": 1e-5, "rel_l2": 1e-5}


def merged_limit(metric: str, dtype: str, current: float, derived: float) -> float:
    """The derived limit; at the ideal (the honest variant was bitwise equal) the general table's limit;
    float32 never tighter than ``FP32_FLOOR``."""
    if derived == IDEAL[metric] or not math.isfinite(derived):
        return current
    if dtype == "fp32":
        higher = metric in ("psnr", "ssim", "cosine")
        return min(derived, FP32_FLOOR[metric]) if higher else max(derived, FP32_FLOOR[metric])
    return derived


def shapes_tables(limits: dict[str, Any], general: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``<metric>@shapes`` tables: float32's numerical limits from its measurements; every dtype below float32
    (and ``default``) at the loosest of theirs (on a guided 50-step trajectory any rounding below float32 grows
    to a divergence of the same kind, so its size is not the dtype's: the one honest TF32 variant measured
    here, 21.5 dB, did not cover the fast DiT in TF32 on an H100, 14.1 dB; the learned metrics judge), and
    quantization at those limits too (structure; the learned metrics judge the images)."""
    out = {}
    for metric in PAIR:
        key = "min" if metric in ("psnr", "ssim", "cosine") else "max"
        current = general[metric]["numerical"][key]
        values = {dtype: merged_limit(metric, dtype, current.get(dtype, current["default"]), measured[metric])
                  for dtype, measured in limits["numerical"].items()}
        below_fp32 = (min if key == "min" else max)(v for dtype, v in values.items() if dtype != "fp32")
        values = {dtype: (v if dtype == "fp32" else below_fp32) for dtype, v in values.items()}
        values["default"] = values["bf16"]
        out[f"{metric}@shapes"] = {"cases": ["shapes-*"], "numerical": {key: values},
                                   "quantization": {key: values["bf16"]}}
    return out


def contract_with(limits: dict[str, Any], base_contract: Path) -> Any:
    """The project's contract with the derived tables for the shapes cases merged in (what the committed
    fixtures/quality_contract.toml holds)."""
    import tomllib

    from pytest_ditgate.quality import contract_from_dict

    data = tomllib.loads(base_contract.read_text(encoding="utf-8"))
    metrics = data["metrics"]
    for metric in LEARNED:
        table = metrics.setdefault(metric, {"cases": ["shapes-*"]})
        table["noise"] = limits["noise"][metric]
        table["numerical"] = {"abs": limits["noise"][metric]}
        table["approximate"] = {"abs": limits["spread"][metric]}
        table["quantization"] = {}
    metrics["class_accuracy"]["min"] = limits["accuracy_floor"]
    general = {metric: metrics[metric] for metric in PAIR}
    for metric in PAIR:
        metrics[metric]["cases"] = ["!shapes-*"]
    metrics.update(shapes_tables(limits, general))
    return contract_from_dict(data, source="derived from " + base_contract.name)


def replay(contract: Any, record: dict[str, Any], variant: str, experiment_class: str, dtype: str, *,
           baseline: str = "baseline", case: str = CASE, seed_set: int = 0) -> dict[str, Any]:
    """The gate's own checks (limits, floors, regressions, transitions) replayed on the recorded values of
    one seed set: pixel/latent metrics are against the float32 baseline; learned metrics against ``baseline``.
    Pixel metrics exist only against the 50-step baseline, so another ``baseline`` is judged on the learned
    metrics (what the approximate class judges on these cases)."""
    from harness import judge_recorded

    raw = record["raw"]

    def values(rule: Any) -> tuple[str, float, float | None] | None:
        measured = raw[variant].get(rule.metric)
        if measured is None or (rule.spec.pair and baseline != "baseline"):
            return None
        base = None if rule.spec.pair else raw[baseline][rule.metric][seed_set]
        return ("latents" if rule.metric in ("rel_l2", "cosine") else "images"), measured[seed_set], base

    result = judge_recorded(values, contract=contract, experiment_class=experiment_class, case=case, dtype=dtype)
    return {"variant": variant, "baseline": baseline, "class": experiment_class, "dtype": dtype, "case": case,
            "passed": result.passed, "transition": result.transition, "failures": result.failures[:4]}


def replay_all(contract: Any, record: dict[str, Any]) -> list[dict[str, Any]]:
    """Every variant against the baseline under the class it claims; then against other frozen baselines (10
    steps; a broken one, the dropped shift), judged on the learned metrics: the four-way transitions of the
    accuracy floor on this corpus."""
    out = [replay(contract, record, name, cls, dtype) for name, (dtype, cls) in VARIANTS.items()]
    for baseline, names in (("steps-10", ("baseline", "dropped-shift")), ("dropped-shift", ("baseline", "dropped-shift"))):
        out += [replay(contract, record, name, "approximate", "fp32", baseline=baseline,
                       case=f"shapes-ddim-50-vs-{baseline}") for name in names]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True, help="results file")
    parser.add_argument("--replay", help="recompute the transitions of a recorded JSON under the project's contract "
                                         "(no sampling) and rewrite its table file")
    parser.add_argument("--seeds", type=int, default=5, help="seed sets (each one corpus-sized batch)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--repeat", type=int, default=None, help="images per class (default: the case's)")
    parser.add_argument("--steps", type=int, default=None, help="override the case's steps (smoke runs)")
    parser.add_argument("--kernel-order", action="store_true",
                        help=f"measure the float32 kernel-order record instead ({KERNEL_ORDER_CASE}, the fast DiT "
                             "against the baseline, on --device, usually cpu)")
    args = parser.parse_args(argv)
    if args.replay:
        return replay_recorded(Path(args.replay), Path(args.json))
    if args.kernel_order:
        return measure_kernel_order(Path(args.json), args.device, args.seeds)

    import torch

    from dit_impl.corpus import load_corpus
    from dit_impl.shapes.scorer import scorer

    case = next(c for c in load_corpus() if c.name == CASE)
    repeat = args.repeat or case.repeat
    labels = list(case.class_labels) * repeat
    kwargs = dict(class_labels=labels, steps=args.steps or case.steps, guidance_scale=case.guidance_scale,
                  scheduler=case.scheduler)
    classify = scorer(args.device)
    variants = build_variants(args.device)
    raw: dict[str, dict[str, list[float]]] = {name: {} for name in variants}
    started = time.perf_counter()
    for index in range(args.seeds):
        seed = case.seed + 1000 * index
        outputs = {}
        for name, (model, overrides, context) in variants.items():
            outputs[name] = sample_images(model, {**kwargs, **overrides, "seed": seed}, context)
        ref = outputs["baseline"]
        for name, (images, latents) in outputs.items():
            values = learned_metrics(classify, images, labels)
            if name != "baseline":
                values.update(pair_metrics(images, latents, *ref))
            for metric, value in values.items():
                raw[name].setdefault(metric, []).append(value)
        print(f"seed set {index + 1}/{args.seeds} ({seed}) done at {time.perf_counter() - started:.0f} s", flush=True)
    stats = {name: {metric: summarise(values) for metric, values in metrics.items()} for name, metrics in raw.items()}
    limits = derive_limits(stats, raw, len(labels), load_kernel_order())
    record = {
        "what": "quality contract calibration on the trained dit-s-shapes model (benchmarks/shapes_calibration.py)",
        "case": CASE, "images": len(labels), "seed_sets": [case.seed + 1000 * i for i in range(args.seeds)],
        "sampling": kwargs | {"labels": f"{case.class_labels} x {repeat}"},
        "variants": {name: {"dtype": d, "class": c} for name, (d, c) in VARIANTS.items()},
        "stats": stats, "raw": raw, "limits": limits,
        **provenance(args.device, started, f"python3 benchmarks/shapes_calibration.py --seeds {args.seeds}"),
    }
    record["transitions"] = replay_all(contract_with(limits, ROOT / "fixtures" / "quality_contract.toml"), record)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    for line in table_lines(record):
        print(line)
    return 0


def provenance(device: str, started: float, command: str) -> dict[str, Any]:
    """Where and how a record was measured: device name and arch, torch, seconds since ``started``, time."""
    import platform

    import torch

    from harness import arch_label

    cuda = device.startswith("cuda")
    return {"device": torch.cuda.get_device_name(0) if cuda else f"cpu ({platform.machine()})",
            "arch": arch_label(torch.cuda.get_device_capability(0)) if cuda else "cpu",
            "torch": torch.__version__, "seconds": round(time.perf_counter() - started, 1),
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "command": command}


def load_kernel_order() -> dict[str, Any] | None:
    """The committed float32 kernel-order record, or None before one is measured."""
    return json.loads(KERNEL_ORDER.read_text(encoding="utf-8")) if KERNEL_ORDER.is_file() else None


def measure_kernel_order(target: Path, device: str, seeds: int) -> int:
    """The fast DiT in float32 (the lane's CPU candidate: float32, no CUDA-only switch, on ``device``) and,
    for scale, the GELU swap against the float32 baseline on the CPU case, over ``seeds`` seed sets: how far
    another float32 reduction order moves this model's samples. Writes the record with provenance."""
    import torch

    from dit_impl.baseline import load_model
    from dit_impl.corpus import load_corpus
    from dit_impl.fast.candidate import options_for
    from dit_impl.fast.sampling import fast_model
    from dit_impl.shapes.variants import erf_gelu

    case = next(c for c in load_corpus() if c.name == KERNEL_ORDER_CASE)
    base = load_model("dit-s-shapes", dtype="float32", device=device)
    options = options_for("cpu")  # float32 on any device (options_for("cuda") is the bf16 candidate)
    variants = {"fast-fp32": fast_model(base, options), "erf-gelu": erf_gelu(base)}
    kwargs = dict(class_labels=list(case.class_labels) * case.repeat, steps=case.steps,
                  guidance_scale=case.guidance_scale, scheduler=case.scheduler)
    raw: dict[str, dict[str, list[float]]] = {name: {} for name in variants}
    started = time.perf_counter()
    seed_sets = [case.seed + 1000 * index for index in range(seeds)]
    for seed in seed_sets:
        ref = sample_images(base, {**kwargs, "seed": seed}, contextlib.nullcontext)
        for name, model in variants.items():
            got = sample_images(model, {**kwargs, "seed": seed}, contextlib.nullcontext)
            for metric, value in pair_metrics(*got, *ref).items():
                raw[name].setdefault(metric, []).append(value)
    record = {
        "what": "float32 kernel order on the trained dit-s-shapes model: the fast DiT against the baseline "
                "(benchmarks/shapes_calibration.py --kernel-order)",
        "case": case.name, "images": len(kwargs["class_labels"]), "seed_sets": seed_sets,
        "sampling": kwargs, "fast_options": options.label(),
        "stats": {name: {metric: summarise(values) for metric, values in metrics.items()}
                  for name, metrics in raw.items()},
        "raw": raw, "threads": torch.get_num_threads(),
        **provenance(device, started,
                     f"python3 benchmarks/shapes_calibration.py --kernel-order --device {device} --seeds {seeds}"),
    }
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    for name, metrics in record["stats"].items():
        worst = {m: v["min" if m in ("psnr", "ssim", "cosine") else "max"] for m, v in metrics.items()}
        print(f"{name:10s} " + "  ".join(f"{m} {v:.6g}" for m, v in worst.items()))
    return 0


def replay_recorded(source: Path, target: Path) -> int:
    """The limits and transitions of a recorded calibration, under the rule and the committed contract as
    they stand; writes the JSON and a text table beside it."""
    from pytest_ditgate.quality import load_contract

    record = json.loads(source.read_text(encoding="utf-8"))
    # the rule as it stands, on the recorded distributions
    record["limits"] = derive_limits(record["stats"], record["raw"], record["images"], load_kernel_order())
    contract = load_contract(ROOT / "fixtures" / "quality_contract.toml", label="fixtures/quality_contract.toml")
    record["transitions"] = replay_all(contract, record)
    record["transitions_contract"] = "fixtures/quality_contract.toml"
    from harness import write_table

    write_table(target, record, table_lines(record))
    return 0


def table_lines(record: dict[str, Any]) -> list[str]:
    """Mean (and worst) of every metric per variant, the derived limits, then the transitions."""
    stats = record["stats"]
    head = f"{'variant':<15} {'accuracy':>15} {'frechet':>15} {'psnr min':>9} {'ssim min':>9} {'tile max':>9} {'relL2 max':>10}"
    lines = [f"calibration at {record['case']} ({record['images']} images, {len(record['seed_sets'])} seed sets, "
             f"{record['device']}):", head]
    for name, metrics in stats.items():
        acc, fd = metrics["class_accuracy"], metrics["frechet_distance"]
        row = f"{name:<15} {acc['mean']:>8.4f}+-{acc['std']:<6.4f}{fd['mean']:>8.3f}+-{fd['std']:<6.3f}"
        if "psnr" in metrics:
            row += (f" {metrics['psnr']['min']:>9.2f} {metrics['ssim']['min']:>9.5f} {metrics['worst_tile_mae']['max']:>9.2e}"
                    f" {metrics['rel_l2']['max']:>10.2e}")
        lines.append(row.rstrip())
    lines.append(f"derived limits: {json.dumps(record['limits'])}")
    for item in record["transitions"]:
        lines.append(f"  {item['variant']:<15} vs {item['baseline']:<9} {item['class']:<12} {item['dtype']:<5} "
                     f"{item['transition']:<11} {'passed' if item['passed'] else 'FAILED: ' + (item['failures'] or [''])[0][:90]}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
