#!/usr/bin/env python3
"""The README's test command on a fresh clone: set-up and tests timed apart, against the project's targets.

Clones the repository's committed HEAD into a temporary folder (nothing of this checkout's venv, caches or
uncommitted files travels), then runs the README's second command in its two steps, ``./scripts/bootstrap``
and ``./scripts/test``, timing each with the host clock. Targets (issue 35): the tests in at most 180 s and
the whole command in at most 360 s on two cores. Writes ``test_command_<cores>cpu.json`` with the machine
(CPU model, cores, memory), Python, the commit, each step's seconds and exit code, and the tail of the test
output; prints a short table last.

    python benchmarks/test_command.py [--out benchmarks/results] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGETS = {"tests_s": 180.0, "whole_s": 360.0}


def machine() -> dict:
    """What the timings depend on: the CPU, how many cores this process may use, memory, Python, the OS."""
    model = ""
    try:
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), "")
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 0
    memory_gb = None
    try:
        kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal"))
        memory_gb = round(kib / 2**20, 1)
    except (OSError, StopIteration, ValueError):
        pass
    return {"cpu": model, "cores": cores, "memory_gb": memory_gb, "python": sys.version.split()[0],
            "platform": platform.platform(), "load_before": os.getloadavg()}


def step(command: list[str], cwd: Path, log: Path) -> tuple[int, float]:
    start = time.monotonic()
    with log.open("w") as out:
        code = subprocess.run(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                              env={k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DITGATE_"))}
                              ).returncode
    return code, time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--keep", action="store_true", help="keep the temporary clone")
    ns = parser.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    work = Path(tempfile.mkdtemp(prefix="ditgate-fresh-"))
    clone = work / "clone"
    record: dict = {"commit": commit, "machine": machine(), "targets": TARGETS,
                    "command": "./scripts/bootstrap && ./scripts/test"}
    try:
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        setup_code, setup_s = step(["./scripts/bootstrap"], clone, work / "bootstrap.log")
        tests_code, tests_s = (step(["./scripts/test", "-q"], clone, work / "test.log") if setup_code == 0
                               else (None, 0.0))
        tail = (work / "test.log").read_text().splitlines()[-3:] if (work / "test.log").exists() else []
        record.update(bootstrap={"exit": setup_code, "seconds": round(setup_s, 1)},
                      tests={"exit": tests_code, "seconds": round(tests_s, 1), "tail": tail},
                      whole_s=round(setup_s + tests_s, 1))
        record["passed"] = (setup_code == 0 and tests_code == 0 and tests_s <= TARGETS["tests_s"]
                            and setup_s + tests_s <= TARGETS["whole_s"])
    finally:
        if ns.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    out = Path(ns.out) / f"test_command_{record['machine']['cores']}cpu.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"\n=== README test command on a fresh clone of {commit[:12]}, {record['machine']['cores']} cores "
          f"({record['machine']['cpu']}) ===")
    print(f"bootstrap  {record['bootstrap']['seconds']:7.1f} s  exit {record['bootstrap']['exit']}")
    print(f"tests      {record['tests']['seconds']:7.1f} s  exit {record['tests']['exit']}  (target <= {TARGETS['tests_s']:.0f} s)"
          f"  {' '.join(record['tests']['tail'][-1:])}")
    print(f"whole      {record['whole_s']:7.1f} s  (target <= {TARGETS['whole_s']:.0f} s)")
    print(f"PASS: {record['passed']}  -> {out.name}")
    return 0 if record["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
