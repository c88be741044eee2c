"""Torch's reduced-precision switches against ``check_kernel`` on the tolerance corpus (issue 48, item 2).

On CUDA, ``torch.backends.cuda.matmul.allow_tf32``, ``torch.backends.cudnn.allow_tf32`` and
``allow_fp16/bf16_reduced_precision_reduction`` let cuBLAS and cuDNN compute an fp32 GEMM or convolution on
TF32 tensor cores, or add an fp16/bf16 GEMM's partial sums in fp16/bf16. For every GEMM and convolution of the
tolerance corpus (``tests/plugin/test_tolerance_corpus.py``, ``Op.library``) and every switch that acts on its
dtype, this script measures:

- whether the switch changes the result (the op with the switch on against it off, bit for bit, on two seeds;
  the largest relative difference);
- ``check_kernel``'s verdict on the op run under the switch (the candidate turns it on around its call): it
  must be ``precision_downgrade`` where the switch changes the result; declared with ``compute_dtype`` it
  must pass; the op without the switch must pass (never a false alarm);
- each check's wall time.

Run on a GPU: ``python benchmarks/precision_probe_switches.py --out benchmarks/results`` (the corpus's GPU
sizes); ``--device cpu`` runs the CPU sizes, where the switches change nothing and every check passes (the
report says so). Writes ``precision_probe_switches_<arch>.json`` with provenance and exits 1 when a switch
that changes a result is not caught, a declared one fails, or an honest op fails. Timer: ``time.perf_counter``
around each whole ``check_kernel`` call, the device synchronised before and after.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import harness

TIMER = "time.perf_counter around each whole check_kernel call, the device synchronised before and after"


def _all_off() -> None:
    """Every switch off: the honest state each case starts from."""
    from tests.plugin import test_tolerance_corpus as corpus

    for switch in corpus.SWITCHES:
        corpus.set_switch(switch, False)


def _largest_difference(switch: str, op: Any, make: Any, seeds: int = 2) -> float:
    """The largest relative difference of the op's output with the switch on against off, over the seeds."""
    from tests.plugin import test_tolerance_corpus as corpus

    worst = 0.0
    for seed in range(seeds):
        args = make(seed)
        on, off = corpus.under(switch, op.reference)(*args).double(), op.reference(*args).double()
        worst = max(worst, float((on - off).norm() / off.norm().clamp(min=1e-300)))
    return worst


def _check(candidate: Any, op: Any, make: Any, device: str, **options: Any) -> dict[str, Any]:
    import torch

    from pytest_ditgate import GateFailure, check_kernel

    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    try:
        report = check_kernel(candidate, op.reference, make, **options)
        verdict = "passed"
    except GateFailure as failure:
        report, verdict = failure.report, failure.reason
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return {"verdict": verdict, "probe": report.precision.status, "switches": report.precision.switches,
            "seconds": round(seconds, 3)}


def measure(device: str, gpu_sizes: bool, trials: int) -> list[dict[str, Any]]:
    from tests.plugin import test_tolerance_corpus as corpus

    rows = []
    for op in corpus.OPS:
        for switch, (dtype, kind, declared) in corpus.SWITCHES.items():
            dtypes = op.gpu_dtypes if gpu_sizes else op.dtypes
            if op.library != kind or dtype not in dtypes:
                continue
            _all_off()
            make = op.make_inputs(dtype, device, gpu=gpu_sizes)
            options = dict(trials=trials, label=f"{op.name} {dtype} under {switch}", **corpus._scales(op))
            changes = corpus.changes_the_result(switch, op, make)
            row = {"op": op.name, "dtype": dtype, "switch": switch, "changes_result": changes,
                   "largest_relative_difference": _largest_difference(switch, op, make),
                   "under_switch": _check(corpus.under(switch, op.reference), op, make, device, **options),
                   "declared": _check(corpus.under(switch, op.reference), op, make, device, compute_dtype=declared,
                                      **options),
                   "switch_off": _check(op.reference, op, make, device, **options)}
            under = row["under_switch"]["verdict"]
            row["ok"] = ((under == "precision_downgrade") if changes else (under == "passed")) and \
                row["declared"]["verdict"] == "passed" and row["switch_off"]["verdict"] == "passed"
            rows.append(row)
            harness.log(f"{op.name} {dtype} {switch.rsplit('.', 1)[-1]}: changes {changes}, under it {under}, "
                        f"declared {row['declared']['verdict']}, off {row['switch_off']['verdict']}")
    _all_off()
    return rows


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    from tests.plugin import test_tolerance_corpus as corpus

    summary = {}
    for switch in corpus.SWITCHES:
        mine = [row for row in rows if row["switch"] == switch]
        changed = [row for row in mine if row["changes_result"]]
        summary[switch] = {
            "cases": len(mine), "changes_result": len(changed),
            "caught_where_it_changes": sum(row["under_switch"]["verdict"] == "precision_downgrade" for row in changed),
            "declared_passed": sum(row["declared"]["verdict"] == "passed" for row in mine),
            "false_alarms_switch_off": sum(row["switch_off"]["verdict"] != "passed" for row in mine),
            "failed_without_effect": sum(row["under_switch"]["verdict"] != "passed" for row in mine
                                         if not row["changes_result"])}
    return summary


def table(summary: dict[str, Any]) -> str:
    lines = ["| switch | cases | changes the result | caught there | declared passes | off: false alarms |",
             "|---|---|---|---|---|---|"]
    for switch, s in summary.items():
        lines.append(f"| {switch.removeprefix('torch.backends.')} | {s['cases']} | {s['changes_result']} | "
                     f"{s['caught_where_it_changes']} | {s['declared_passed']} | {s['false_alarms_switch_off']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="folder for precision_probe_switches_<arch>.json")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--trials", type=int, default=5, help="check_kernel's trials per check")
    parser.add_argument("--cpu-sizes", action="store_true", help="the corpus's CPU sizes on a GPU too")
    args = parser.parse_args(argv)
    import torch

    from tests.plugin import test_tolerance_corpus as corpus

    gpu_sizes = args.device.startswith("cuda") and not args.cpu_sizes
    saved = {switch: corpus.set_switch(switch, False) for switch in corpus.SWITCHES}  # restored at the end
    try:
        rows = measure(args.device, gpu_sizes, args.trials)
    finally:
        for switch, value in saved.items():
            corpus.set_switch(switch, value)
    summary = summarise(rows)
    missed = [f"{row['op']} {row['dtype']} {row['switch']}" for row in rows if not row["ok"]]
    record = {"benchmark": "precision_probe_switches", "command": " ".join(["python", *sys.argv]),
              "sizes": "gpu" if gpu_sizes else "cpu", "trials": args.trials, "threads": torch.get_num_threads(),
              "timer": TIMER, "summary": summary, "cases": rows, "missed": missed,
              "environment": harness.environment()}
    harness.write_record(args.out, "precision_probe_switches", record)
    print(table(summary))
    if missed:
        print(f"not as expected: {', '.join(missed)}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
