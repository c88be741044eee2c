#!/usr/bin/env python3
"""Is fewer-step sampling measurably worse on the trained shapes DiT? Paired seed sets, large samples.

    python3 benchmarks/shapes_steps.py --json benchmarks/results/shapes_steps_sm_90.json

At the baseline setting of ``shapes-ddim-50`` (DDIM, guidance 4, float32, TF32 off) each seed set samples the
same labels and starting noise at every step count, so the step count is the only difference within a set.
Per set: class accuracy and the Frechet distance on the shipped classifier's features. Per step count: the
mean over the sets, and the paired difference from 50 steps with its 95 % t-interval. "Measurably worse" is an
interval wholly on the worse side (accuracy lower, Frechet distance higher). The calibration's 200-image sets
are too small for this (its seed-to-seed spread of the Frechet distance is 4 points).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import sys
import time
from typing import Any

from harness import ROOT, write_table  # noqa: F401 - ROOT puts the repository on sys.path
from shapes_calibration import CASE, learned_metrics, provenance, sample_images

#: two-sided 95 % quantiles of Student's t by degrees of freedom (sets - 1)
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131}
#: the direction in which each metric gets worse
WORSE = {"class_accuracy": -1, "frechet_distance": +1}


def paired_interval(values: list[float], reference: list[float]) -> dict[str, float]:
    """Mean paired difference ``values - reference`` and its 95 % t-interval."""
    differences = [v - r for v, r in zip(values, reference)]
    mean = statistics.fmean(differences)
    half = T95[len(differences) - 1] * statistics.stdev(differences) / math.sqrt(len(differences))
    return {"mean": mean, "low": mean - half, "high": mean + half}


def verdict(metric: str, interval: dict[str, float]) -> str:
    """``worse``, ``better`` or ``same`` (the interval holds zero) for a paired difference from the reference."""
    sign = WORSE[metric]
    if (interval["low"] if sign > 0 else -interval["high"]) > 0:
        return "worse"
    if (interval["high"] if sign > 0 else -interval["low"]) < 0:
        return "better"
    return "same"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True, help="results file (a .txt table is written beside it)")
    parser.add_argument("--steps", default="50,25,10,5", help="step counts; the first is the reference")
    parser.add_argument("--seeds", type=int, default=6, help="seed sets")
    parser.add_argument("--repeat", type=int, default=100, help="images per class in each set")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    if not 2 <= args.seeds <= len(T95) + 1:
        parser.error(f"--seeds must be 2..{len(T95) + 1}")

    from dit_impl.baseline import load_model
    from dit_impl.corpus import load_corpus
    from dit_impl.shapes.scorer import scorer

    case = next(c for c in load_corpus() if c.name == CASE)
    steps = [int(s) for s in args.steps.split(",")]
    labels = list(case.class_labels) * args.repeat
    model = load_model("dit-s-shapes", dtype="float32", device=args.device)
    classify = scorer(args.device)
    raw: dict[str, dict[str, list[float]]] = {str(n): {} for n in steps}
    seed_sets = [case.seed + 1000 * index for index in range(args.seeds)]
    started = time.perf_counter()
    for seed in seed_sets:
        for n in steps:
            images, _ = sample_images(model, dict(class_labels=labels, steps=n, guidance_scale=case.guidance_scale,
                                                  scheduler=case.scheduler, seed=seed),
                                         contextlib.nullcontext)
            for metric, value in learned_metrics(classify, images, labels).items():
                raw[str(n)].setdefault(metric, []).append(value)
        print(f"seed set {seed} done at {time.perf_counter() - started:.0f} s", flush=True)
    reference = raw[str(steps[0])]
    summary: dict[str, dict[str, Any]] = {}
    for n in steps:
        summary[str(n)] = {}
        for metric in WORSE:
            entry: dict[str, Any] = {"mean": statistics.fmean(raw[str(n)][metric]),
                                     "std": statistics.stdev(raw[str(n)][metric])}
            if n != steps[0]:
                entry["paired"] = paired_interval(raw[str(n)][metric], reference[metric])
                entry["verdict"] = verdict(metric, entry["paired"])
            summary[str(n)][metric] = entry
    record = {"what": "fewer-step DDIM sampling against the case's 50 on the trained dit-s-shapes model, paired "
                      "seed sets (benchmarks/shapes_steps.py)",
              "case": CASE, "images_per_set": len(labels), "seed_sets": seed_sets, "steps": steps,
              "sampling": {"scheduler": case.scheduler, "guidance_scale": case.guidance_scale, "dtype": "float32",
                           "labels": f"{case.class_labels} x {args.repeat}"},
              "raw": raw, "summary": summary,
              **provenance(args.device, started, "python3 benchmarks/shapes_steps.py " + " ".join(
                  f"--{k} {v}" for k, v in (("steps", args.steps), ("seeds", args.seeds), ("repeat", args.repeat))))}
    lines = table_lines(record)
    write_table(args.json, record, lines)
    return 0


def table_lines(record: dict[str, Any]) -> list[str]:
    """Per step count: mean accuracy and Frechet distance, and the paired difference from the reference."""
    lines = [f"steps on {record['case']} ({record['images_per_set']} images x {len(record['seed_sets'])} paired seed "
             f"sets, {record['device']}):",
             f"{'steps':>5} {'accuracy':>16} {'vs ref (95% CI)':>26} {'frechet':>15} {'vs ref (95% CI)':>26}"]
    for n, metrics in record["summary"].items():
        row = f"{n:>5}"
        for metric in WORSE:
            entry = metrics[metric]
            row += f" {entry['mean']:>8.4f}+-{entry['std']:<6.4f}"
            if "paired" in entry:
                p = entry["paired"]
                row += f" {p['mean']:+8.4f} [{p['low']:+.4f}, {p['high']:+.4f}] {entry['verdict']:<6}"
            else:
                row += f" {'reference':>26}"
        lines.append(row.rstrip())
    return lines


if __name__ == "__main__":
    sys.exit(main())
