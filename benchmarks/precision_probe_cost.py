"""What the precision probe costs: ``check_kernel`` with and without it on the tolerance corpus (issue 48).

The probe runs the candidate and the float64 reference once more per check (on the last trial, or on a trial
that failed its bound). This script times ``check_kernel`` on every case of the tolerance corpus
(``tests/plugin/test_tolerance_corpus.py``: 31 ops, 66 cases in fp32/fp16/bf16 at its CPU sizes; the candidate is
the op's own torch kernel, or its float64-then-cast variant where torch's accumulates in the low precision on
CUDA) with ``check_precision=True`` and ``False``, interleaved, in three settings:

- ``default``: ``check_kernel``'s defaults (5 trials, 3 extremal trials, determinism, poisoning);
- ``one_trial``: the same with ``trials=1`` (the user asks for one run; the extremal trials still follow);
- ``bare``: ``trials=1`` with no extremal trials, no determinism run and no poisoning (``ditbench.pair``'s
  agreement check): the probe's share is largest there.

Per case the median over ``--repeats`` of each side; the cost of a setting is the sum over cases of the
medians with the probe over the sum without (and the median and worst per-case ratio beside it). Targets:
at most 1.25x at the default trials and 1.5x at one trial. Timer: ``time.perf_counter`` around each whole
``check_kernel`` call (the device synchronised before and after on CUDA).

    python benchmarks/precision_probe_cost.py --out benchmarks/results

writes ``precision_probe_cost_<arch>.json`` (with provenance) and exits 1 when a target is missed.
``--ops "gemm K=4096,softmax" --repeats 1`` runs a subset.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import harness

SETTINGS = {
    "default": {},
    "one_trial": {"trials": 1},
    "bare": {"trials": 1, "input_scales": (), "check_determinism": False, "poison_memory": False},
}
TARGETS = {"default": 1.25, "one_trial": 1.5}
TIMER = "time.perf_counter around each whole check_kernel call (CUDA synchronised before and after)"


def _timed(call: Any, device: str) -> float:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    call()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def measure(ops: list[str] | None, repeats: int, device: str) -> list[dict[str, Any]]:
    """Per corpus case and setting: the seconds with and without the probe (median over repeats) and the
    probe's verdict."""
    from tests.plugin import test_tolerance_corpus as corpus

    from pytest_ditgate import check_kernel

    rows = []
    for op, dtype in corpus.cases():
        if ops and op.name not in ops:
            continue
        make = op.make_inputs(dtype, device)
        # torch's own kernel, unless on this device it accumulates in the low precision (then the honest
        # float64-then-cast variant: the check must pass for the probe's cost to mean anything)
        honest = corpus.honest_variants(op, dtype, device)
        candidate = honest.get("torch", honest["float64-then-cast"])
        scales = corpus._scales(op)
        row: dict[str, Any] = {"op": op.name, "dtype": dtype}
        for setting, options in SETTINGS.items():
            options = {**scales, **options} if "input_scales" not in options else dict(options)
            if dtype in op.extremal_unsafe:
                options["input_scales"] = ()  # torch's own low-precision kernel is outside those scales
            sides: dict[bool, list[float]] = {True: [], False: []}
            status = None
            for probe in (True, False):  # warm-up: first calls load kernels and lazy imports
                check_kernel(candidate, op.reference, make, check_precision=probe, **options)
            for _ in range(repeats):
                for probe in (True, False):
                    holder = {}

                    def call(probe: bool = probe, holder: dict = holder) -> None:
                        holder["report"] = check_kernel(candidate, op.reference, make, check_precision=probe,
                                                        label=f"{op.name} {dtype}", **options)

                    sides[probe].append(_timed(call, device))
                    if probe:
                        status = holder["report"].precision.status
            on, off = statistics.median(sides[True]), statistics.median(sides[False])
            row[setting] = {"with_probe_s": on, "without_probe_s": off, "ratio": on / off, "probe": status}
        rows.append(row)
        harness.log(f"{op.name} {dtype}: " + ", ".join(f"{s} {row[s]['ratio']:.2f}x" for s in SETTINGS))
    return rows


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    summary = {}
    for setting in SETTINGS:
        on = sum(row[setting]["with_probe_s"] for row in rows)
        off = sum(row[setting]["without_probe_s"] for row in rows)
        ratios = [row[setting]["ratio"] for row in rows]
        worst = max(rows, key=lambda row: row[setting]["ratio"])
        summary[setting] = {"ratio": on / off, "median_case_ratio": statistics.median(ratios),
                            "worst_case_ratio": worst[setting]["ratio"],
                            "worst_case": f"{worst['op']} {worst['dtype']}", "with_probe_s": on,
                            "without_probe_s": off, "target": TARGETS.get(setting)}
    return summary


def table(summary: dict[str, Any]) -> str:
    lines = ["| setting | cost with the probe | median case | worst case | target |", "|---|---|---|---|---|"]
    for setting, s in summary.items():
        target = f"<= {s['target']}x" if s["target"] else "-"
        lines.append(f"| {setting} | {s['ratio']:.3f}x ({s['with_probe_s']:.1f} s / {s['without_probe_s']:.1f} s) | "
                     f"{s['median_case_ratio']:.3f}x | {s['worst_case_ratio']:.3f}x ({s['worst_case']}) | {target} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="folder for precision_probe_cost_<arch>.json")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads (the corpus tests use 1)")
    parser.add_argument("--ops", default="", help="comma-separated corpus op names (default: every op)")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    ops = [name.strip() for name in args.ops.split(",") if name.strip()] or None
    rows = measure(ops, args.repeats, args.device)
    summary = summarise(rows)
    missed = [setting for setting, s in summary.items() if s["target"] and s["ratio"] > s["target"]]
    record = {"benchmark": "precision_probe_cost", "command": " ".join(["python", *sys.argv]),
              "threads": torch.get_num_threads(), "repeats": args.repeats, "timer": TIMER, "targets": TARGETS,
              "summary": summary, "cases": rows, "missed": missed, "environment": harness.environment()}
    text = table(summary)
    harness.write_record(args.out, "precision_probe_cost", record)
    print(text)
    if missed:
        print(f"target missed: {', '.join(missed)}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
