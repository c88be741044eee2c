#!/usr/bin/env python3
"""What a change costs in GPU check device time: ``scripts/gpu_check.py --plan`` on a one-line edit of each
file, in a copy of the tree, against the committed record (its unit times and inputs).

Each row copies the project (no caches, environments or .git), appends a comment to one file, and runs the
plan there with the record of the tree in hand, leaving out the units the untouched tree already owes (so
that each row is what its edit adds), on a machine of one GPU and of 4 and 8 (a lane per GPU,
``gpu_check.py --plan --gpus N``). Writes ``gpu_check_cost.json`` (``--out``) with each row's units, stages,
calls and device time, and the record's provenance; prints the table last.

The record's entries are first re-keyed with today's stage definitions (in a temporary copy): a changed
definition makes every unit of its stage debt, which says nothing of what an edit costs, while the inputs
and times the record measured do.

Run: ``python benchmarks/gpu_check_cost.py --out benchmarks/results [--tree REV]`` (``--tree``: the commit the
record was made on, when the working tree has moved since).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_record  # noqa: E402 - the record's keys
import gpu_stages  # noqa: E402 - today's stage definitions
RECORD = ROOT / "benchmarks" / "results" / "gpu_check.json"
SKIP = shutil.ignore_patterns(".git", ".venv", ".whl", ".gl", ".stage", ".ditgate", "__pycache__", "*.pyc",
                              ".pytest_cache", ".hypothesis", ".tox", "build", "dist", "*.egg-info")
#: (what the row stands for, the file edited); the first four are the rows of issue 45's acceptance table
ROWS = [
    ("the judge", "src/pytest_ditgate/experiment/judge.py"),
    ("one kernel's binding", "kernels/residual.py"),
    ("one kernel's CUDA source", "kernels/csrc/gated_residual.cu"),
    ("the adaLN kernels", "kernels/adaln.py"),
    ("one of the plugin's tests", "tests/plugin/test_report.py"),
    ("README", "README.md"),
    ("a doc", "docs/agent_loop.md"),
    ("a benchmark result", "benchmarks/results/INDEX.md"),
    ("the correctness gate", "src/pytest_ditgate/correctness/checks.py"),
    ("the plugin's entry point", "src/pytest_ditgate/plugin.py"),
    ("the fast DiT's model", "dit_impl/fast/model.py"),
    ("a GPU suite's test", "tests/gates/test_bench_gpu.py"),
    ("a benchmark with targets", "benchmarks/timer_fidelity.py"),
    ("the judge, with the stages that run it end to end", "src/pytest_ditgate/experiment/judge.py"),
]
#: units a row counts although the untouched tree owes them too: the stages that judge experiments end to end
#: have no run recorded on the record's tree, so no edit makes them stale there; each runs the judge, so a
#: change to it makes them stale once they have run (at their estimates until measured)
COUNTED = {"the judge, with the stages that run it end to end": tuple(
    f"{name}:{unit}" for name in ("attacks", "empty", "classes") for unit in gpu_stages.BY_NAME[name].units(ROOT))}
#: the machines each row is planned for: GPUs of one host, a lane each
GPUS = (1, 4, 8)
COMMENT = {".py": "\n# a one-line edit (gpu_check_cost)\n", ".cu": "\n// a one-line edit (gpu_check_cost)\n",
           ".md": "\nA one-line edit (gpu_check_cost).\n"}


def plan(tree: Path, record: Path, leave_out: list[str] | None = None, gpus: int = 1) -> dict:
    out = tree / "plan.json"
    extra = ["--gpus", str(gpus)]
    if leave_out:
        (tree / "leave_out.json").write_text(json.dumps(leave_out))
        extra += ["--leave-out", str(tree / "leave_out.json")]
    run = subprocess.run([sys.executable, "scripts/gpu_check.py", "--plan", "--record", str(record), "--json", str(out),
                          *extra], cwd=tree, capture_output=True, text=True, timeout=600)
    if run.returncode != 0:
        raise SystemExit(f"gpu_check.py --plan failed in {tree}: {run.stderr[-2000:]}")
    return json.loads(out.read_text())


def with_todays_definitions(data: dict) -> dict:
    """The record with each entry keyed as if its stage's definition were today's (inputs, environment and
    result as measured)."""
    for name, stage in ((n, gpu_stages.BY_NAME.get(n)) for n in (data.get("stages") or {})):
        for entry in (data["stages"][name].get("units") or {}).values() if stage else ():
            entry["definition"] = stage.definition()
            entry["key"] = gpu_record.unit_key(entry["inputs_sha256"], entry["environment"], stage.definition())
    return data


def row(label: str, rel: str, plans: dict[int, dict]) -> dict:
    """A row of the table: the units and stages of the one-GPU plan, and the calls and device time on each
    machine (``gpus_<N>``: the plan for N GPUs, a lane each)."""
    found = plans[1]
    per_stage: dict[str, int] = {}
    for call in found["calls"]:
        for part in call["parts"]:
            per_stage[part["stage"]] = per_stage.get(part["stage"], 0) + len(part["units"])
    lanes = {f"gpus_{gpus}": {"calls": len(p["calls"]), "work_s": p["work_s"], "device_s": p["device_s"],
                              "lanes": [c["lanes"] for c in p["calls"]]}
             for gpus, p in plans.items() if gpus > 1}
    return {"label": label, "file": rel, "units": found["units"], "stages": per_stage, "calls": len(found["calls"]),
            "stage_s": found["stage_s"], "work_s": found["work_s"], "device_s": found["device_s"], **lanes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", default=str(RECORD))
    parser.add_argument("--tree", default=None, metavar="REV",
                        help="measure on the tree of this commit (the one the record was made on) instead of the "
                             "working tree")
    parser.add_argument("--out", default=None, help="folder for gpu_check_cost.json")
    ns = parser.parse_args(argv)
    record = Path(ns.record).resolve()
    data = json.loads(record.read_text())
    with tempfile.TemporaryDirectory(prefix="gpu-check-cost-") as tmp:
        rekeyed = Path(tmp) / "record.json"
        rekeyed.write_text(json.dumps(with_todays_definitions(json.loads(record.read_text()))))
        record = rekeyed
        base = Path(tmp) / "tree"
        if ns.tree:
            base.mkdir()
            archive = subprocess.run(["git", "archive", "--format=tar", ns.tree], cwd=ROOT, capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
            for name in ("gpu_check.py", "gpu_record.py", "gpu_inputs.py", "gpu_stages.py", "gpu_lanes.py",
                         "gpu_lane_exec.py"):  # today's planner
                shutil.copy2(ROOT / "scripts" / name, base / "scripts" / name)
        else:
            shutil.copytree(ROOT, base, ignore=SKIP)
        untouched = plan(base, record)
        rows = []
        for label, rel in ROWS:
            tree = Path(tmp) / f"row-{len(rows)}"
            shutil.copytree(base, tree)
            path = tree / rel
            path.write_text(path.read_text() + COMMENT.get(path.suffix, "\n# edit\n"))
            leave_out = [u for u in untouched["unit_ids"] if u not in COUNTED.get(label, ())]
            rows.append(row(label, rel, {gpus: plan(tree, record, leave_out, gpus) for gpus in GPUS}))
            shutil.rmtree(tree)
    devices = sorted({(e.get("provenance") or {}).get("device") for s in (data.get("stages") or {}).values()
                      for e in (s.get("units") or {}).values()} - {None})
    commit = subprocess.run(["git", "rev-parse", "--short", ns.tree or "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    result = {"benchmark": "gpu_check_cost", "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "commit": commit, "record_tree_hash": data.get("tree_hash"), "record_devices": devices,
              "untouched_tree_debt": untouched["unit_ids"], "timer": "none: --plan's estimates from the record's "
              "measured unit times (test time per file and each test stage's measured fixed cost: stage_s; plus "
              "the set-up of each call: work_s; plus one machine start: device_s); on N GPUs (gpus_N) a call lasts its "
              "longest lane plus its set-up", "rows": rows}
    if ns.out:
        Path(ns.out).mkdir(parents=True, exist_ok=True)
        (Path(ns.out) / "gpu_check_cost.json").write_text(json.dumps(result, indent=1) + "\n")
    if untouched["units"]:
        print(f"note: the untouched tree has {untouched['units']} unit(s) in debt ({', '.join(untouched['unit_ids'])}); "
              "the rows leave them out")
    wider = " ".join(f"{f'{gpus} GPUs s':>9s}" for gpus in GPUS[1:])
    print(f"{'a change to':58s} {'units':>5s} {'calls':>5s} {'stage s':>8s} {'device s':>9s} {wider}  stages")
    for found in rows:
        stages = ", ".join(f"{k} {v}" for k, v in found["stages"].items()) or "-"
        wider = " ".join(f"{found[f'gpus_{gpus}']['device_s']:9.0f}" for gpus in GPUS[1:])
        print(f"{found['label'] + ' (' + found['file'] + ')':58s} {found['units']:5d} {found['calls']:5d} "
              f"{found['stage_s']:8.0f} {found['device_s']:9.0f} {wider}  {stages}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
