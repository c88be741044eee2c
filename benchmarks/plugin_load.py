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


def collect_once(project: Path, with_plugin: bool) -> float:
    args = [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider"]
    if not with_plugin:
        args += ["-p", "no:ditgate"]
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    start = time.perf_counter()
    subprocess.run(args, cwd=project, capture_output=True, env=env)
    return (time.perf_counter() - start) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "plugin_load.json"))
    args = parser.parse_args()
    profile = import_profile()
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        (project / "test_empty.py").write_text("def test_nothing():\n    pass\n")
        for _ in range(2):  # warm the OS file cache for both variants
            collect_once(project, True), collect_once(project, False)
        with_plugin, without = [], []
        for _ in range(args.runs):  # interleaved so drift cancels
            with_plugin.append(collect_once(project, True))
            without.append(collect_once(project, False))
    med_with, med_without = statistics.median(with_plugin), statistics.median(without)
    result = {
        "benchmark": "plugin_load",
        "timer": "wall clock (time.perf_counter) around a pytest subprocess",
        "runs_each": args.runs,
        "median_ms_with_plugin": round(med_with, 1),
        "median_ms_without_plugin": round(med_without, 1),
        "overhead_ms": round(med_with - med_without, 1),
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
    ok = not profile["heavy_modules_imported"] and result["overhead_ms"] < 50
    print(f"{'case':<34}{'median ms':>10}")
    print(f"{'pytest --co, plugin loaded':<34}{med_with:>10.1f}")
    print(f"{'pytest --co, -p no:ditgate':<34}{med_without:>10.1f}")
    print(f"{'overhead':<34}{med_with - med_without:>10.1f}  (target < 50)")
    print(f"heavy modules imported by the plugin: {profile['heavy_modules_imported'] or 'none'}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
