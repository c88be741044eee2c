#!/usr/bin/env python3
"""How often the judge keeps nothing: empty commits on the DiT lane, each judged by ``ditgate experiment``, must be
11 (not faster than the lane best) in at least 19 of 20 runs (issue 46). A KEEP here is noise taken for a gain,
and every honest candidate after it must beat a best that was never real.

Copies the working tree into a temporary git repository, records the DiT lane's baseline there, then commits and
judges ``--runs`` empty commits one after another as ``numerical`` (a KEEP would make the next run compare with
it, as in an agent's loop). Writes a JSON record (``--json``: every run's exit code, objective and interval, the
count of 11s) and exits 1 when fewer than ``--min-discards`` of them are 11 or any is neither 0 nor 11. It is the
GPU check's ``empty`` stage (``scripts/gpu_check.py --stages empty``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_loop_check import (project_repository, run_in_scratch, tree_commit, verdict_of,  # noqa: E402 - the
                              write_record)  # loop's repository and commands



def run(work: Path, log, runs: int) -> tuple[int, list[dict]]:
    loop = project_repository(work, log)
    baseline = loop.baseline()
    print(f"{'PASS' if baseline == 0 else 'FAIL'}  baseline, lane dit: exit {baseline} (expected 0)", flush=True)
    results: list[dict] = []
    if baseline != 0:
        return baseline, results
    for index in range(runs):
        loop.git("commit", "-q", "--allow-empty", "-m", f"empty commit {index + 1}")
        started = time.perf_counter()
        code = loop.experiment("numerical", f"empty commit {index + 1}")
        objective = (verdict_of(loop).get("verdict") or {}).get("objective") or {}
        results.append({"run": index + 1, "exit": code, "seconds": round(time.perf_counter() - started, 1),
                        "ratio": objective.get("ratio"), "ci_low": objective.get("ci_low"),
                        "ci_high": objective.get("ci_high"), "vs_best": objective.get("vs_best")})
        print(f"run {index + 1}: exit {code}" + (f", ratio {objective['ratio']:.4f}" if objective.get("ratio") else ""),
              flush=True)
    return baseline, results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="empty commits to judge (default 20)")
    parser.add_argument("--min-discards", type=int, default=None,
                        help="how many must be 11 (default: all but one in 20, scaled to --runs)")
    parser.add_argument("--json", default=None, help="write the record here (and the log beside it)")
    ns = parser.parse_args(argv)
    if ns.runs < 1:
        parser.error("--runs must be at least 1")
    need = ns.min_discards if ns.min_discards is not None else ns.runs - max(0, ns.runs // 20)
    import torch

    on_gpu = torch.cuda.is_available()
    commit = tree_commit()
    started = time.time()
    (baseline, results), error, base = run_in_scratch("empty", lambda base, log: run(base / "work", log, ns.runs),
                                                      (-1, []))
    discards = sum(r["exit"] == 11 for r in results)
    others = [r for r in results if r["exit"] not in (0, 11)]
    passed = baseline == 0 and not error and len(results) == ns.runs and discards >= need and not others
    target = {"name": f"empty commits judged 11 (of {ns.runs})", "value": discards, "limit": f">= {need}",
              "runs": len(results), "pass": passed}
    record = {"targets": [target], "runs": results, "baseline_exit": baseline, "error": error,
              "keeps": sum(r["exit"] == 0 for r in results), "other_exits": [r["exit"] for r in others],
              "seconds": round(time.time() - started, 1), "device": "gpu" if on_gpu else "cpu",
              "gpu": torch.cuda.get_device_name(0) if on_gpu else None, "torch": torch.__version__,
              "commit": commit}
    print(f"{'PASS' if passed else 'FAIL'}  {target['name']}: {discards} (needs {target['limit']})", flush=True)
    if ns.json:
        write_record(record, ns.json, base, base / "empty.log")
    shutil.rmtree(base, ignore_errors=True)
    if error:
        print(f"empty-commit run broke: {error}", file=sys.stderr)
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
