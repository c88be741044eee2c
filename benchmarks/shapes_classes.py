#!/usr/bin/env python3
"""Where each experiment class's changes fall on the trained shapes DiT, and the learned-metric limits of a case
from the baseline's own spread over seeds.

    python3 benchmarks/shapes_classes.py --case shapes-ddim-20 --device cpu --seeds 20 \\
        --json benchmarks/results/shapes_classes_cpu.json
    python3 benchmarks/shapes_classes.py --case shapes-ddim-50 --device cuda --seeds 12 \\
        --variants "steps=25;steps=10;steps=5;steps=4;steps=3;steps=2;steps=1;fast:dtype=bfloat16;fast:tf32=1;\\
fast:dtype=bfloat16,quant=fp8;fast:dtype=bfloat16,quant=fp8_tensor;fast:dtype=bfloat16,quant=int8_weight;\\
fast:dtype=bfloat16,quant=int4_noscale" --json benchmarks/results/shapes_classes_sm_90.json

A corpus case of ``dit-s-shapes`` at its own size (its labels, its image count), for several seed sets (the
case's seed, then +1000 each). The reference is the float32 fast DiT (TF32 off) with the candidate's sampler at
its default, bitwise the baseline's loop. Each variant runs beside it on the same seeds: a ``SamplerOptions``
label (``steps=5``, ``guidance_cutoff=0.5``, ``block_cache=2:6:2``: approximate), or ``fast:`` and a
``FastOptions`` label on top of the reference's (``fast:dtype=bfloat16``, ``fast:tf32=1``: numerical;
``fast:quant=fp8``: quantization; fp8 GEMMs are emulated where they cannot run). Every image set is scored by
the shipped classifier (class accuracy, Frechet distance), and each variant's images and final latents are
compared with the reference's of the same seeds (PSNR, SSIM, worst tile, rel-L2, cosine: ``pairs``).

The rule (``derive``; docs/quality_calibration.md; a test checks that the committed contract holds what it gives
on the committed data):

* ``sigma``: the reference's seed-to-seed standard deviation of each learned metric (accuracy: never below the
  binomial standard error of the case's image count);
* ``spread`` = Z x sqrt(2) x sigma, the regression ``approximate`` allows: an approximate candidate draws other
  images of the same distribution, so against the golden its difference is that of two independent draws.
  With Z = 2 a candidate whose images are such a draw is refused by one metric with probability 2.3 %
  (one-sided normal), by either at most 4.6 %: the stated false-refusal rate. ``measured_false_refusal`` is the
  share of ordered pairs of the reference's own seed sets (one judged against the other) refused;
* ``noise`` = 2 x the RMS paired difference of the honest numerical variants (below float32) from the reference
  on the same seeds: the regression ``numerical`` allows, and ``quantization``'s seed noise (zero regression
  beyond it);
* the accuracy floor (judged on the baseline too) = the reference's mean less one spread, at most 0.9.

Each variant is then judged per seed set against the reference of the same seeds by its class's limits:
``accepted`` when refused in at most one seed set in ten, ``refused`` when in more than half, ``between``
otherwise; and at the case's own seed, which is what the lane judges. ``--replay JSON`` recomputes it all from a
recorded run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from harness import ROOT, write_table  # noqa: F401 - ROOT puts the repository on sys.path
from shapes_calibration import PAIR, learned_metrics, pair_metrics, provenance

#: the z of the allowed approximate regression: one-sided false refusal P(N(0,1) > Z) per metric
Z = 2.0
FALSE_REFUSAL = 0.5 * math.erfc(Z / math.sqrt(2))
#: a variant refused in at most this share of seed sets is accepted; in more than ``REFUSED`` refused
ACCEPTED, REFUSED = 0.1, 0.5
LEARNED = ("class_accuracy", "frechet_distance")
#: the direction in which each metric gets worse
WORSE = {"class_accuracy": -1, "frechet_distance": +1}
REFERENCE = "default"
#: pair metrics where higher is better (the worst is the lowest)
HIGHER = ("psnr", "ssim", "cosine")
FAST = "fast:"
DEFAULT_VARIANTS = ("steps=10;steps=5;steps=4;steps=3;steps=2;steps=1;guidance_cutoff=0.5;block_cache=2:6:2;"
                    "fast:dtype=bfloat16;fast:quant=int8_weight;fast:quant=fp8;fast:quant=int4_noscale")


def variant_class(name: str) -> str:
    """The experiment class a variant's change belongs to."""
    if not name.startswith(FAST):
        return "approximate"
    return "quantization" if "quant=" in name and "quant=none" not in name else "numerical"


def derive(raw: dict[str, dict[str, list[float]]], images: int) -> dict[str, Any]:
    """The case's learned-metric limits: spread (approximate), noise (numerical, quantization), floor."""
    reference = raw[REFERENCE]
    sigma, spread, noise = {}, {}, {}
    honest = [name for name in raw if variant_class(name) == "numerical"]
    for metric in LEARNED:
        s = statistics.stdev(reference[metric])
        if metric == "class_accuracy":
            p = statistics.fmean(reference[metric])
            s = max(s, math.sqrt(p * (1 - p) / images))
        sigma[metric] = s
        spread[metric] = Z * math.sqrt(2) * s
        differences = [v - r for name in honest for v, r in zip(raw[name][metric], reference[metric])]
        noise[metric] = 2 * math.sqrt(statistics.fmean(d * d for d in differences)) if differences else None
    floor = min(0.9, statistics.fmean(reference["class_accuracy"]) - spread["class_accuracy"])
    limits = {"sigma": sigma, "spread": spread, "noise": noise, "honest_numerical": honest, "accuracy_floor": floor,
              "z": Z, "false_refusal_per_metric": FALSE_REFUSAL, "false_refusal_bound": 2 * FALSE_REFUSAL}
    sets = len(reference["class_accuracy"])
    pairs = list(itertools.permutations(range(sets), 2))
    refused = sum(bool(refusals("approximate", reference, reference, i, j, limits)) for i, j in pairs)
    limits["measured_false_refusal"] = refused / len(pairs) if pairs else None
    return limits


def quantization_structure(record: dict[str, Any]) -> dict[str, float]:
    """The structure limits an honest quantization needs: 2x the worst pixel/latent error, over the seed sets,
    of the quantization variants the learned metrics accept (PSNR 6 dB lower; SSIM and cosine 2x further from
    1, never below 0). The contract's quantization limits on the shapes cases are the loosest of these and
    bf16's numerical ones: they catch gross breakage only, the learned metrics judge."""
    honest = [name for name, verdict in record["verdicts"].items()
              if verdict["class"] == "quantization" and verdict["verdict"] == "accepted"]
    worst = {metric: (min if metric in HIGHER else max)(value for name in honest for value in record["raw"][name][metric])
             for metric in PAIR}
    return {"psnr": worst["psnr"] - 6.0, "ssim": max(0.0, 1 - 2 * (1 - worst["ssim"])),
            "worst_tile_mae": 2 * worst["worst_tile_mae"], "rel_l2": 2 * worst["rel_l2"],
            "cosine": max(0.0, 1 - 2 * (1 - worst["cosine"]))}


def allowed(experiment_class: str, metric: str, limits: dict[str, Any]) -> float:
    """The regression a class allows a learned metric: the spread (approximate) or the paired noise."""
    if experiment_class == "approximate":
        return limits["spread"][metric]
    return limits["noise"][metric] or 0.0


def refusals(experiment_class: str, values: dict[str, list[float]], golden: dict[str, list[float]], index: int,
             golden_index: int, limits: dict[str, Any]) -> list[str]:
    """Why seed set ``index`` of ``values`` is refused against seed set ``golden_index`` of ``golden``."""
    out = []
    for metric in LEARNED:
        regression = WORSE[metric] * (values[metric][index] - golden[metric][golden_index])
        limit = allowed(experiment_class, metric, limits)
        if regression > limit + 1e-9:  # an accuracy of n/10 images is a float: equal is not beyond
            out.append(f"{metric} regressed {regression:.4g} > {limit:.4g}")
    if values["class_accuracy"][index] < limits["accuracy_floor"] - 1e-9:
        out.append(f"class_accuracy {values['class_accuracy'][index]:.4g} < floor {limits['accuracy_floor']:.4g}")
    return out


def verdicts(raw: dict[str, dict[str, list[float]]], limits: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per variant: its class, the mean paired change, the share of seed sets refused, the verdict, the case
    seed's verdict."""
    reference = raw[REFERENCE]
    out = {}
    for name, values in raw.items():
        if name == REFERENCE:
            continue
        cls = variant_class(name)
        sets = len(values["class_accuracy"])
        why = [refusals(cls, values, reference, i, i, limits) for i in range(sets)]
        share = sum(bool(w) for w in why) / sets
        out[name] = {"class": cls,
                     "paired": {m: statistics.fmean(v - r for v, r in zip(values[m], reference[m])) for m in LEARNED},
                     "refused_share": share,
                     "verdict": "accepted" if share <= ACCEPTED else "refused" if share > REFUSED else "between",
                     "case_seed": "refused: " + "; ".join(why[0]) if why[0] else "accepted"}
    return out


def build(name: str, base: Any, device: str) -> tuple[Any, Any]:
    """(model, sampler options) of a variant."""
    from dit_impl.fast.options import FastOptions
    from dit_impl.fast.sampler import SamplerOptions
    from dit_impl.fast.sampling import fast_model

    options = FastOptions(dtype="float32", sdpa="math" if device == "cpu" else "auto",
                          fp8_emulate=device == "cpu")
    if name.startswith(FAST):
        return fast_model(base, FastOptions.parse(name[len(FAST):], options)), SamplerOptions()
    return fast_model(base, options), SamplerOptions.parse("" if name == REFERENCE else name)


def measure(case_name: str, device: str, seeds: int, variants: list[str]) -> tuple[dict[str, Any], list[int], int]:
    import torch

    from dit_impl.baseline import load_model
    from dit_impl.corpus import load_corpus
    from dit_impl.fast.sampler import sample
    from dit_impl.shapes.scorer import scorer
    from dit_impl.shapes.variants import tf32

    case = next(c for c in load_corpus() if c.name == case_name)
    labels = list(case.class_labels) * case.repeat
    base = load_model("dit-s-shapes", dtype="float32", device=device)
    classify = scorer(device)
    built = {name: build(name, base, device) for name in (REFERENCE, *variants)}
    raw: dict[str, dict[str, list[float]]] = {name: {} for name in built}
    seed_sets = [case.seed + 1000 * index for index in range(seeds)]
    started = time.perf_counter()
    for seed in seed_sets:
        reference = None
        for name, (model, sampler) in built.items():
            with tf32(False), torch.no_grad():
                result = sample(model, labels, seed=seed, steps=case.steps, guidance_scale=case.guidance_scale,
                                scheduler=case.scheduler, options=sampler)
            images, latents = result.images.float().cpu(), result.latents.float().cpu()
            values = learned_metrics(classify, images, labels)
            if reference is None:
                reference = images, latents
            else:
                values.update(pair_metrics(images, latents, *reference))
            for metric, value in values.items():
                raw[name].setdefault(metric, []).append(value)
        print(f"seed set {seed} done at {time.perf_counter() - started:.0f} s", flush=True)
    return raw, seed_sets, len(labels)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True, help="results file (a .txt table is written beside it)")
    parser.add_argument("--case", default="shapes-ddim-20", help="a dit-s-shapes corpus case")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS,
                        help="';'-separated: SamplerOptions labels, or 'fast:' and a FastOptions label")
    parser.add_argument("--seeds", type=int, default=20, help="seed sets")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--replay", help="recompute limits and verdicts of a recorded JSON (no sampling)")
    args = parser.parse_args(argv)
    if args.replay:
        record = json.loads(Path(args.replay).read_text(encoding="utf-8"))
    else:
        started = time.perf_counter()
        raw, seed_sets, images = measure(args.case, args.device, args.seeds, args.variants.split(";"))
        record = {"what": "each class's changes against the default on the trained dit-s-shapes model, paired seed "
                          "sets at the case's size (benchmarks/shapes_classes.py)",
                  "case": args.case, "images_per_set": images, "seed_sets": seed_sets, "raw": raw,
                  **provenance(args.device, started, "python3 benchmarks/shapes_classes.py " + " ".join(
                      f"--{k} '{v}'" for k, v in (("case", args.case), ("device", args.device),
                                                   ("seeds", args.seeds), ("variants", args.variants))))}
    record["limits"] = derive(record["raw"], record["images_per_set"])
    record["verdicts"] = verdicts(record["raw"], record["limits"])
    lines = table_lines(record)
    write_table(args.json, record, lines)
    return 0


def table_lines(record: dict[str, Any]) -> list[str]:
    limits, raw = record["limits"], record["raw"]
    rate = limits["measured_false_refusal"]

    def noise(metric: str) -> str:
        value = limits["noise"][metric]
        return "-" if value is None else f"{value:.4g}"

    lines = [f"experiment classes on {record['case']} ({record['images_per_set']} images x "
             f"{len(record['seed_sets'])} paired seed sets, {record['device']}):",
             f"spread (approximate): accuracy {limits['spread']['class_accuracy']:.4f} (sigma "
             f"{limits['sigma']['class_accuracy']:.4f}), Frechet {limits['spread']['frechet_distance']:.3f} "
             f"(sigma {limits['sigma']['frechet_distance']:.3f}); noise (numerical, quantization): accuracy "
             f"{noise('class_accuracy')}, Frechet {noise('frechet_distance')}; accuracy floor "
             f"{limits['accuracy_floor']:.4f}",
             f"false refusal of an independent draw under the spread: {limits['false_refusal_per_metric']:.1%} per "
             f"metric, at most {limits['false_refusal_bound']:.1%} for both; measured on the reference's own seed-set "
             "pairs: " + ("-" if rate is None else f"{rate:.1%}"),
             f"{'variant':<34} {'class':<12} {'accuracy':>15} {'d acc':>7} {'frechet':>16} {'d fd':>8} {'refused':>7}"
             "  verdict (at the case's seed)"]
    pairs = ["worst over the seed sets against the reference's images and latents:",
             f"{'variant':<34} " + " ".join(f"{metric:>14}" for metric in PAIR)]
    for name, verdict in [(REFERENCE, None), *record["verdicts"].items()]:
        acc, fd = raw[name]["class_accuracy"], raw[name]["frechet_distance"]
        paired = verdict["paired"] if verdict else None
        row = (f"{name:<34} {verdict['class'] if verdict else 'reference':<12} "
               f"{statistics.fmean(acc):>7.4f}+-{statistics.stdev(acc):<6.4f} "
               f"{format(paired['class_accuracy'], '+.3f') if paired else '':>7} "
               f"{statistics.fmean(fd):>8.3f}+-{statistics.stdev(fd):<6.3f} "
               f"{format(paired['frechet_distance'], '+.3f') if paired else '':>8}")
        if verdict:
            row += f" {verdict['refused_share']:>7.0%}  {verdict['verdict']} ({verdict['case_seed']})"
            if all(m in raw[name] for m in PAIR):
                worst = [min(raw[name][m]) if m in HIGHER else max(raw[name][m]) for m in PAIR]
                pairs.append(f"{name:<34} " + " ".join(f"{value:>14.5g}" for value in worst))
        lines.append(row.rstrip())
    return lines + pairs


if __name__ == "__main__":
    sys.exit(main())
