"""Benchmark: what the installed plugin costs every pytest run.

1. ``python -X importtime -c "import pytest_ditgate.plugin"`` must import no torch (nor NVML, diffusers).
2. ``pytest --co -q`` on an empty project, with the plugin and with ``-p no:ditgate``, interleaved,
   median of N runs each; the difference must stay under 50 ms.

Writes ``benchmarks/results/plugin_load.json`` and prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAVY = ("torch", "pynvml", "diffusers", "triton", "numpy")


def import_profile() -> dict:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", "import pytest_ditgate.plugin"],
                          capture_output=True, text=True, check=True)
    modules = {}
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line or "cumulative" in line:
            continue
        _self_us, cumulative_us, name = line[len("import time:"):].split("|")
        modules[name.strip()] = int(cumulative_us)
    heavy = sorted(name for name in modules if name.split(".")[0] in HEAVY)
    return {"heavy_modules_imported": heavy, "plugin_cumulative_us": modules.get("pytest_ditgate.plugin")}


def collect_once(project: Path, with_plugin: bool, bytecode_cache: bool = True) -> float:
    args = [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider"]
    if not with_plugin:
        args += ["-p", "no:ditgate"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    if not bytecode_cache:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(args, cwd=project, capture_output=True, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU time of the pytest process (user + system): far less noisy than wall time on a shared machine
    return ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)) * 1e3


def paired_median_ci(a: list[float], b: list[float], rounds: int = 2000) -> tuple[float, float, float]:
    """Median of the paired differences a[i] - b[i] (runs interleaved, so drift cancels) and its 95 %
    bootstrap interval: each sample is a whole pytest process on a shared machine, so single runs are noisy."""
    import random

    pairs = [x - y for x, y in zip(a, b)]
    rng = random.Random(0)
    boot = sorted(statistics.median(rng.choices(pairs, k=len(pairs))) for _ in range(rounds))
    return statistics.median(pairs), boot[int(0.025 * rounds)], boot[int(0.975 * rounds) - 1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "plugin_load.json"))
    args = parser.parse_args()
    profile = import_profile()
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        (project / "test_empty.py").write_text("def test_nothing():\n    pass\n")
        for _ in range(2):  # warm the OS file cache and the bytecode caches for both variants
            collect_once(project, True), collect_once(project, False)
        with_plugin, without, with_nocache, without_nocache = [], [], [], []
        for _ in range(args.runs):  # interleaved so drift cancels
            with_plugin.append(collect_once(project, True))
            without.append(collect_once(project, False))
            with_nocache.append(collect_once(project, True, bytecode_cache=False))
            without_nocache.append(collect_once(project, False, bytecode_cache=False))
    med_with, med_without = statistics.median(with_plugin), statistics.median(without)
    overhead, low, high = paired_median_ci(with_plugin, without)
    nocache_overhead, _, _ = paired_median_ci(with_nocache, without_nocache)
    result = {
        "benchmark": "plugin_load",
        "timer": "CPU time (user + system) of each pytest subprocess (getrusage of children)",
        "runs_each": args.runs,
        "median_ms_with_plugin": round(med_with, 1),
        "median_ms_without_plugin": round(med_without, 1),
        "overhead_ms": round(overhead, 1),
        "overhead_ms_ci95": [round(low, 1), round(high, 1)],
        "overhead_estimator": "median of paired differences (interleaved runs), bootstrap 95 % interval",
        "overhead_ms_min_of_runs": round(min(with_plugin) - min(without), 1),
        "bytecode_cache": "on (a normal install; PYTHONDONTWRITEBYTECODE unset, caches warm)",
        "overhead_ms_without_bytecode_cache": round(nocache_overhead, 1),
        "median_ms_with_plugin_without_bytecode_cache": round(statistics.median(with_nocache), 1),
        "median_ms_without_plugin_without_bytecode_cache": round(statistics.median(without_nocache), 1),
        "samples_ms_with": [round(x, 1) for x in with_plugin],
        "samples_ms_without": [round(x, 1) for x in without],
        **profile,
        "provenance": {
            "python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count(),
            "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    ok = not profile["heavy_modules_imported"] and overhead < 50
    print(f"{'case':<34}{'median ms':>10}")
    print(f"{'pytest --co, plugin loaded':<34}{med_with:>10.1f}")
    print(f"{'pytest --co, -p no:ditgate':<34}{med_without:>10.1f}")
    print(f"{'overhead (paired median)':<34}{overhead:>10.1f}  (95% CI {low:.1f}..{high:.1f}; target < 50)")
    print(f"{'overhead (fastest run of each)':<34}{min(with_plugin) - min(without):>10.1f}")
    print(f"{'overhead, no bytecode cache':<34}{nocache_overhead:>10.1f}  (PYTHONDONTWRITEBYTECODE=1: every run re-parses)")
    print(f"heavy modules imported by the plugin: {profile['heavy_modules_imported'] or 'none'}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
