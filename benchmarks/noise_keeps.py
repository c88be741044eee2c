#!/usr/bin/env python3
"""Noise KEEPs after a baseline: empty commits judged by ``ditgate experiment`` on a CPU lane must be 11.

Builds the synthetic project of docs/agent_loop.md's loop (``tests/plugin/judge_project.py``: a reference, a
candidate with an ``nn.Linear``, a quality test, a ``ditbench.pair`` speed test) in a temporary git
repository, records its baseline with ``ditgate baseline``, then judges ``--commits`` empty commits one after
the other, each as the doc says (``git commit --allow-empty``, ``ditgate experiment``). An empty commit is
the same code as the best: anything but exit 11 (DISCARD, performance) is a noise verdict. Issue 51's target:
at least 19 of 20 are 11, in each lane variant:

* ``recorded``: the lane has no re-measuring test, so each candidate's ratio to the baseline implementation
  is compared with the best's recorded ratio (the first best is the baseline's own);
* ``recorded_fast``: the same, with a candidate about 6x faster than the reference (a ratio near 0.15, as the
  issue's lanes had: a small kernel against a plain reference);
* ``remeasured``: the lane re-measures the best side by side (``ditgate_lane``), as the project's template does.

Writes ``noise_keeps_cpu.json`` (machine, commit, per variant: each commit's exit code and ratio, the best's
ratio, the count of 11s and whether the target holds); prints a table last; exits 1 when a target is missed.

    python benchmarks/noise_keeps.py [--commits 20] [--variants recorded,remeasured] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "plugin"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import judge_project  # noqa: E402  (the synthetic project of the judge's tests)
from test_command import machine  # noqa: E402

VARIANTS = ("recorded", "recorded_fast", "remeasured")
#: at least this share of the empty commits must be 11 (issue 51: 19 of 20)
TARGET_SHARE = 19 / 20
_RATIO = re.compile(r"^objective: .*?: ([0-9.]+) \(CI ([0-9.]+)\.\.([0-9.]+)\)", re.M)


def lane_gate(variant: str) -> str:
    if variant == "remeasured":
        return judge_project.GATE
    return judge_project.GATE[:judge_project.GATE.index("def test_versus_lane_best")]


def run_variant(variant: str, commits: int, work: Path) -> dict:
    project = judge_project.create(work / variant)
    project.write("tests/gates/test_gate.py", lane_gate(variant))
    if variant == "recorded_fast":
        project.candidate(repeat=4)  # 4 tanh passes where the reference makes 24
    project.commit(f"the lane, {variant}")
    start = time.monotonic()
    baseline = project.ditgate("baseline", "--lane", "fwd")
    record: dict = {"baseline": {"exit": baseline.returncode, "seconds": round(time.monotonic() - start, 1)}}
    if baseline.returncode != 0:
        record["baseline"]["tail"] = (baseline.stdout + baseline.stderr)[-3000:]
        return record
    best = json.loads((project.root / ".ditgate" / "lanes" / "fwd.jsonl").read_text().splitlines()[-1])["best"]
    record["best_ratio"] = best["objective"]["ratio"]
    runs = []
    for index in range(commits):
        project.commit(f"empty {index}")
        start = time.monotonic()
        result = project.experiment(cls="exact", description=f"empty {index}")
        found = _RATIO.search(result.stdout)
        runs.append({"exit": result.returncode, "seconds": round(time.monotonic() - start, 1),
                     "ratio": float(found.group(1)) if found else None,
                     "ci": [float(found.group(2)), float(found.group(3))] if found else None})
        print(f"{variant:10s} empty commit {index + 1:2d}: exit {result.returncode}"
              + (f", ratio {found.group(1)}" if found else ""), flush=True)
    elevens = sum(1 for run in runs if run["exit"] == 11)
    record.update(runs=runs, elevens=elevens, commits=commits,
                  target_met=elevens >= TARGET_SHARE * commits)
    return record


def commit() -> str | None:
    """The commit measured: ``$DITGATE_COMMIT`` (a copied tree), else the checkout's HEAD (``-dirty`` with
    uncommitted changes to tracked files), else None."""
    if os.environ.get("DITGATE_COMMIT"):
        return os.environ["DITGATE_COMMIT"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode != 0:
        return None
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    return head.stdout.strip() + ("-dirty" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=20)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ns = parser.parse_args(argv)
    variants = [v for v in ns.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    import torch

    record: dict = {"commit": commit(), "machine": machine(), "torch": torch.__version__,
                    "torch_threads": torch.get_num_threads(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
                    "target": f"at least {TARGET_SHARE:.0%} of the empty commits after a baseline are 11 (DISCARD, "
                    "performance), in each variant", "variants": {}}
    with tempfile.TemporaryDirectory(prefix="ditgate-noise-") as work:
        for variant in variants:
            record["variants"][variant] = run_variant(variant, ns.commits, Path(work))
    record["machine"]["load_after"] = os.getloadavg()  # other work on the host widens the runs' spread
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "noise_keeps_cpu.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"\n{'variant':12s} {'baseline':>9s} {'best ratio':>10s} {'11s':>8s}  target")
    ok = True
    for variant, result in record["variants"].items():
        met = bool(result.get("target_met"))
        ok &= met
        print(f"{variant:12s} {'exit ' + str(result['baseline']['exit']):>9s} {result.get('best_ratio', float('nan')):10.4f} "
              f"{str(result.get('elevens', '-')) + '/' + str(result.get('commits', '-')):>8s}  {'met' if met else 'MISSED'}")
    print(f"wrote {out / 'noise_keeps_cpu.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
