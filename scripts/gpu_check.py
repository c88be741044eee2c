#!/usr/bin/env python3
"""One GPU check for a landing: every GPU suite, the benchmarks with targets, and the agent loop end to end.

CI runs on a CPU, so a change can land green while the GPU gates are red. This script is what a change to
src/, kernels/, dit_impl/, tests/, golden/ or fixtures/ (or conftest.py, pyproject.toml) must pass on a GPU
before it lands: it writes ``benchmarks/results/gpu_check.json`` with the ``tree_hash`` of the tree it
checked, device and versions, counts per suite, every failure, every target (name, value, limit, pass) and
the time. ``python scripts/gpu_check.py --hash`` prints the tree hash on any machine without importing
torch, so a reviewer can see that the committed result belongs to the tree.

Stages (``--stages``, comma-separated; default all, in this order; each has a time limit):

- ``suites``: one pytest process over every GPU suite (kernels, correctness, device, bench, fast DiT, DiT
  gates), counted per suite from its JUnit XML;
- ``corpus``: the tolerance corpus on CUDA, as CORPUS_SHARDS pytest processes in parallel on the one GPU
  (``DITGATE_CORPUS_SHARD``; nothing in it is timed, so sharing the GPU cannot change a verdict);
- ``fidelity``: ``benchmarks/timer_fidelity.py`` (targets met in every one of its consecutive runs);
- ``kernels``: ``benchmarks/kernels_bench.py`` (fused kernels against copy bandwidth and torch.compile);
- ``dit``: ``benchmarks/dit_bench.py`` forward only (the fast DiT-XL/2 forward against diffusers'
  torch.compile + CUDA graph, side by side);
- ``loop``: the documented agent loop in a temporary git repository of this project (baseline, an honest
  speedup KEEP, an empty commit 11, a quality break 10, a fixed-path edit 12, an out-of-scope edit 13).

It fits one 10-minute call on one H200. Where a session's device calls are shorter, run the stages in
several calls on the same tree and combine them: ``--merge a.json b.json --json gpu_check.json`` is green
only when the records share the tree hash and the environment and together ran every stage, each green.
A stage may run again only when named with its reason (``--rerun STAGE=WHY``): the last result counts, and
the earlier ones stay in the record under ``superseded`` for a reviewer to weigh.
Logs go to ``--logs`` (default: a temporary folder).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
HASHED_DIRS = ("src", "kernels", "dit_impl", "tests", "golden", "fixtures")
HASHED_FILES = ("conftest.py", "pyproject.toml")
SKIPPED_DIRS = {"__pycache__", ".ditgate", ".pytest_cache", ".hypothesis", "build", "dist", ".tox"}
SKIPPED_SUFFIXES = (".pyc", ".pyo", ".egg-info", ".lock")  # .lock: filelock's lock files beside what they guard
RESULT = ROOT / "benchmarks" / "results" / "gpu_check.json"

#: suite name -> test paths (relative to the root); one pytest process runs them all
SUITES = {
    "kernels": ["tests/gates/kernels", "tests/kernels"],
    "correctness": ["tests/gates/test_correctness_gpu.py"],
    "device": ["tests/gates/test_device_gate.py"],
    "bench": ["tests/gates/test_bench_gpu.py"],
    "fast_dit": ["tests/dit_fast"],
    "dit_gates": ["tests/gates/dit"],
}
#: the tolerance corpus (it times nothing): this many pytest processes share one GPU, each a shard
CORPUS = "tests/gates/test_tolerance_corpus_gpu.py"
CORPUS_SHARDS = 6
#: stage -> seconds it may take (measured on the H200 with headroom). A landing runs the check in two calls
#: of the device's 10 minutes, merged with ``--merge``: ``suites,corpus,kernels,fidelity`` (about 450 s
#: measured) and ``dit,loop`` (about 420 s; the loop is 11 runs of the DiT lane, about 34 s each with the
#: retrained shapes cases)
STAGE_LIMITS = {"suites": 300, "corpus": 120, "fidelity": 200, "kernels": 120, "dit": 150, "loop": 480}


# -- the tree hash (no torch, no git: the device copy of the tree has no .git) ---------------------------

def hashed_files(root: Path = ROOT) -> list[Path]:
    """Every file the hash covers, sorted by relative path."""
    files = [root / name for name in HASHED_FILES if (root / name).is_file()]
    for top in HASHED_DIRS:
        for folder, dirs, names in os.walk(root / top):
            dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not d.endswith(SKIPPED_SUFFIXES))
            files += [Path(folder) / n for n in names if not n.endswith(SKIPPED_SUFFIXES)]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def tree_hash(root: Path = ROOT) -> str:
    """sha256 over each covered file's relative path and bytes, in sorted order."""
    digest = hashlib.sha256()
    for path in hashed_files(root):
        rel = path.relative_to(root).as_posix().encode()
        data = path.read_bytes()
        digest.update(b"%d:%s\0%d:" % (len(rel), rel, len(data)))
        digest.update(data)
    return digest.hexdigest()


# -- running stages -------------------------------------------------------------------------------------

def run_logged(command: list[str], log: Path, limit: float, cwd: Path = ROOT,
               env: dict[str, str] | None = None) -> tuple[int, float]:
    """Run ``command`` with its output in ``log``; (exit code, seconds). 124 when it ran past ``limit``."""
    codes, seconds = run_logged_together([(command, log, env or child_env())], limit, cwd)
    return codes[0], seconds


def run_logged_together(runs: list[tuple[list[str], Path, dict[str, str]]], limit: float,
                        cwd: Path = ROOT) -> tuple[list[int], float]:
    """Start every ``(command, log, env)`` at once; their exit codes (124 for one still running ``limit``
    seconds after the start, killed with its process group) and the seconds until the last ended."""
    start = time.monotonic()
    started = []
    for command, log, env in runs:
        out = log.open("w")
        started.append((subprocess.Popen(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True), out))
    codes = []
    for process, out in started:
        try:
            codes.append(process.wait(timeout=max(0.0, start + limit - time.monotonic())))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait()
            out.write(f"\n[gpu_check] killed after {limit:.0f} s\n")
            codes.append(124)
        out.close()
    return codes, time.monotonic() - start


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1", **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def suite_of(nodeid_file: str, suites: dict[str, list[str]]) -> str:
    for suite, paths in suites.items():
        if any(nodeid_file == p or nodeid_file.startswith(p.rstrip("/") + "/") for p in paths):
            return suite
    return "other"


def junit_counts(xml: Path, suites: dict[str, list[str]]) -> tuple[dict[str, dict[str, int]], list[str], list[str]]:
    """Per-suite counts (every suite of ``suites``, and "other"), failures (nodeid: first line) and skip
    reasons from a JUnit XML file."""
    counts = {suite: {"passed": 0, "failed": 0, "skipped": 0, "errors": 0} for suite in suites}
    failures, skips = [], []
    for case in ET.parse(xml).getroot().iter("testcase"):
        path = (case.get("file") or case.get("classname", "").replace(".", "/") + ".py")
        nodeid = f"{path}::{case.get('name')}"
        suite = counts.setdefault(suite_of(path, suites), {"passed": 0, "failed": 0, "skipped": 0, "errors": 0})
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed" if child.tag == "failure" else "errors"
                message = (child.get("message") or child.text or "").strip().splitlines()
                failures.append(f"{nodeid}: {message[0][:300] if message else child.tag}")
            elif child.tag == "skipped":
                outcome = "skipped"
                skips.append(f"{nodeid}: {(child.get('message') or '')[:200]}")
        suite[outcome] += 1
    return counts, failures, skips


def pytest_command(xml: Path, durations: int, *paths: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "--ditgate", "-p", "no:cacheprovider", "-q", "-rs",
            f"--durations={durations}", f"--junitxml={xml}", "-o", "junit_family=xunit1", *paths]


def tests_result(codes: list[int], xmls: list[Path], suites: dict[str, list[str]], seconds: float,
                 **extra: Any) -> dict[str, Any]:
    """A stage of pytest runs: counts per suite, failures and skips merged from their JUnit XML; it passes
    when every run exited 0, something passed and nothing failed."""
    counts: dict[str, dict[str, int]] = {}
    failures, skips = [], []
    for code, xml in zip(codes, xmls):
        if not xml.exists():
            failures.append(f"no JUnit XML {xml.name} (exit {code}): see {xml.stem}.log")
            continue
        run_counts, run_failures, run_skips = junit_counts(xml, suites)
        for suite, numbers in run_counts.items():
            total = counts.setdefault(suite, {"passed": 0, "failed": 0, "skipped": 0, "errors": 0})
            for key, value in numbers.items():
                total[key] += value
        failures += run_failures
        skips += run_skips
    failed = sum(c["failed"] + c["errors"] for c in counts.values())
    ran = sum(c["passed"] for c in counts.values())
    return {"rc": max(codes), "seconds": round(seconds, 1), **extra, "counts": counts, "failures": failures,
            "skips": skips, "passed": not any(codes) and not failures and failed == 0 and ran > 0}


def stage_suites(logs: Path, limit: float) -> dict[str, Any]:
    xml = logs / "suites.xml"
    paths = [p for paths in SUITES.values() for p in paths if (ROOT / p).exists()]
    code, seconds = run_logged(pytest_command(xml, 20, *paths), logs / "suites.log", limit)
    return tests_result([code], [xml], SUITES, seconds)


def stage_corpus(logs: Path, limit: float, shards: int = CORPUS_SHARDS) -> dict[str, Any]:
    """The tolerance corpus as ``shards`` parallel pytest processes; counts merged from their JUnit XML."""
    xmls = [logs / f"corpus_{index}.xml" for index in range(shards)]
    runs = [(pytest_command(xml, 10, CORPUS), xml.with_suffix(".log"),
             child_env(DITGATE_CORPUS_SHARD=f"{index}/{shards}")) for index, xml in enumerate(xmls)]
    codes, seconds = run_logged_together(runs, limit)
    return tests_result(codes, xmls, {"tolerance_corpus": [CORPUS]}, seconds, shards=shards)


def targets_from(path: Path, convert: Callable[[dict], list[dict]]) -> tuple[list[dict], list[str]]:
    if not path.exists():
        return [], [f"{path.name} was not written"]
    try:
        return convert(json.loads(path.read_text())), []
    except (ValueError, KeyError, TypeError) as exc:
        return [], [f"{path.name}: cannot read targets ({type(exc).__name__}: {exc})"]


def benchmark_stage(script: str, args: list[str], result_name: str, convert: Callable[[dict], list[dict]],
                    logs: Path, limit: float, out: Path) -> dict[str, Any]:
    code, seconds = run_logged([sys.executable, f"benchmarks/{script}", "--out", str(out), *args],
                               logs / f"{Path(script).stem}.log", limit)
    targets, failures = targets_from(out / result_name, convert)
    failures += [f"target missed: {t['name']} = {t['value']} (limit {t['limit']})" for t in targets if not t["pass"]]
    if code != 0 and not failures:
        failures.append(f"{script} exited {code}: see {Path(script).stem}.log")
    return {"rc": code, "seconds": round(seconds, 1), "targets": targets, "failures": failures,
            "passed": code == 0 and bool(targets) and not failures}


def fidelity_targets(data: dict) -> list[dict]:
    return [dict(t) for t in data["target_records"]]


def kernels_targets(data: dict) -> list[dict]:
    """Fused kernels at the large DiT shape: share of copy bandwidth and speed against torch.compile."""
    copy_tbps = float(data["copy_bandwidth"]["TBps"])
    out = []
    for name, case in data["cases"].items():
        if not name.endswith("64x4096x1152") or "kernels" not in case or "median_ms" not in case.get("kernels", {}):
            continue
        kernels_ms = case["kernels"]["median_ms"]
        share = case["bytes"] / (kernels_ms * 1e-3) / 1e12 / copy_tbps
        floor = 0.95 if case["op"] == "gated_residual" else 0.85
        out.append(_target(f"{name}: share of copy bandwidth", round(share, 3), f">= {floor}", share >= floor))
        compile_ms = case.get("compile", {}).get("median_ms")
        if compile_ms:
            speed = compile_ms / kernels_ms
            out.append(_target(f"{name}: speed vs torch.compile", round(speed, 3), ">= 0.95", speed >= 0.95))
        elif case.get("dtype") == "bf16":  # a target the run did not measure is missed, not dropped
            out.append(_target(f"{name}: speed vs torch.compile",
                               f"not measured ({case.get('compile_skipped') or 'no compile time'})", ">= 0.95", False))
        out.append(_target(f"{name}: kernel_check passed", bool(case.get("check_kernels", {}).get("passed")),
                           "True", bool(case.get("check_kernels", {}).get("passed"))))
    load = data.get("cache_hit_load", {}).get("median_ms")
    if load is not None:
        out.append(_target("cache-hit load of a compiled module (ms)", round(load, 1), "< 50", load < 50))
    return out


def dit_targets(data: dict) -> list[dict]:
    """The fastest fast DiT-XL/2 forward against diffusers compile + CUDA graph, measured in the same run."""
    rows = {r["name"]: r for r in data["results"] if r.get("status") == "ok" and "timing" in r}
    compiled = next((r for n, r in rows.items() if n.startswith("diffusers compile")), None)
    fast = [r for n, r in rows.items() if n.startswith("fast[")]
    if compiled is None or not fast:
        return [_target("DiT forward: fast and diffusers compile+graph both timed", False, "True", False)]
    best = min(fast, key=lambda r: r["timing"]["median_ms"])
    ratio = best["timing"]["median_ms"] / compiled["timing"]["median_ms"]
    out = [_target(f"DiT-XL/2 forward {best['name']} / diffusers compile+graph", round(ratio, 3), "<= 0.95",
                   ratio <= 0.95)]
    out += [_target(f"{r['name']}: rel-L2 vs fp32 within bound", r.get("rel_l2_vs_fp32"), f"<= {r.get('bound')}",
                    r.get("rel_l2_vs_fp32") is not None and r["rel_l2_vs_fp32"] <= r.get("bound", 0))
            for r in fast]
    return out


def _target(name: str, value: Any, limit: str, passed: bool) -> dict[str, Any]:
    return {"name": name, "value": value, "limit": limit, "pass": bool(passed)}


def stage_loop(logs: Path, limit: float) -> dict[str, Any]:
    code, seconds = run_logged([sys.executable, "scripts/agent_loop_check.py", "--json", str(logs / "loop.json")],
                               logs / "loop.log", limit)
    targets, failures = targets_from(logs / "loop.json", lambda d: d["targets"])
    failures += [f"{t['name']}: got {t['value']}, expected {t['limit']}" for t in targets if not t["pass"]]
    if code != 0 and not failures:
        failures.append(f"agent loop exited {code}: see loop.log")
    return {"rc": code, "seconds": round(seconds, 1), "targets": targets, "failures": failures,
            "passed": code == 0 and bool(targets) and not failures}


def run_stages(stages: list[str], arch: str, logs: Path, out: Path,
               after_each: Callable[[dict[str, Any]], None] = lambda results: None) -> dict[str, Any]:
    runners: dict[str, Callable[[], dict[str, Any]]] = {
        "suites": lambda: stage_suites(logs, STAGE_LIMITS["suites"]),
        "corpus": lambda: stage_corpus(logs, STAGE_LIMITS["corpus"]),
        "fidelity": lambda: benchmark_stage("timer_fidelity.py", ["--runs", "3"], f"timer_fidelity_{arch}.json",
                                            fidelity_targets, logs, STAGE_LIMITS["fidelity"], out),
        "kernels": lambda: benchmark_stage("kernels_bench.py", ["--dtypes", "bf16,fp32", "--budget-s", "60"],
                                           f"kernels_bench_{arch}.json", kernels_targets, logs,
                                           STAGE_LIMITS["kernels"], out),
        "dit": lambda: benchmark_stage("dit_bench.py", ["--reps", "30", "--configs", DIT_CONFIGS],
                                       f"dit_bench_{arch}.json", dit_targets, logs, STAGE_LIMITS["dit"], out),
        "loop": lambda: stage_loop(logs, STAGE_LIMITS["loop"]),
    }
    results = {}
    for stage in stages:
        print(f"[gpu_check] {stage} ...", flush=True)
        results[stage] = runners[stage]()
        print(f"[gpu_check] {stage}: {'PASS' if results[stage]['passed'] else 'FAIL'} "
              f"in {results[stage]['seconds']} s", flush=True)
        after_each(results)
    return results


#: the forward configurations dit_bench times in the check: the candidate lane's honest win, the fastest
#: set, seamed, and seamed with quack's GEMMs, QKV and fc1 or fc1 only (where quack-kernels is missing they
#: fall back to cuBLAS, and dit_bench's record says so in the case's report)
DIT_CONFIGS = ("cuda_graphs=1,gelu_epilogue=1,adaln=kernels,sdpa=cudnn;cuda_graphs=1;"
               "cuda_graphs=1,gelu_epilogue=1,adaln=kernels,sdpa=cudnn,block_seam=1;"
               "cuda_graphs=1,gelu_epilogue=1,adaln=kernels,sdpa=cudnn,block_seam=1,gemm=quack;"
               "cuda_graphs=1,gelu_epilogue=1,adaln=kernels,sdpa=cudnn,block_seam=1,gemm=quack_fc1")


def environment() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0]}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(device=props.name, arch=f"sm_{props.major}{props.minor}", memory_gb=round(props.total_memory / 2**30, 1))
        try:
            info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                            capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            info["driver"] = None
    else:
        info.update(device="cpu", arch="cpu")
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    info["packages"] = optional_packages()
    return info


#: optional distributions whose presence changes what the check runs (diffusers: the DiT stages and the
#: quality metrics; quack-kernels and the CuTe DSL: gemm=quack's tests, gate and dit_bench case)
OPTIONAL_PACKAGES = ("diffusers", "quack-kernels", "nvidia-cutlass-dsl")


def optional_packages() -> dict[str, str | None]:
    """The installed version of each optional package (None: missing). Part of the environment, so calls
    merged into one record must have had the same ones: a stage run without quack does not stand in for
    one with it."""
    from pytest_ditgate.toolchain import package_version

    return {name: package_version(name) for name in OPTIONAL_PACKAGES}


def print_table(record: dict[str, Any]) -> None:
    print(f"\n=== gpu_check on {record['environment'].get('device')} ({record['environment'].get('arch')}), "
          f"tree {record['tree_hash'][:12]}, {record['seconds']:.0f} s ===")
    packages = record["environment"].get("packages")
    if packages:
        print("packages: " + ", ".join(f"{name} {version or 'missing'}" for name, version in packages.items()))
    for stage, result in record["stages"].items():
        counts = result.get("counts")
        detail = (" ".join(f"{s}={c['passed']}/{c['failed'] + c['errors']}/{c['skipped']}" for s, c in counts.items())
                  if counts else f"{sum(t['pass'] for t in result.get('targets', []))}/{len(result.get('targets', []))} targets")
        print(f"{'PASS' if result['passed'] else 'FAIL':5s} {stage:9s} {result['seconds']:6.0f} s  {detail}")
        for failure in result.get("failures", [])[:12]:
            print(f"        {failure}")
    for entry in record.get("superseded", []):
        earlier = entry["result"]
        print(f"      {entry['stage']}: an earlier run ({'PASS' if earlier.get('passed') else 'FAIL'}) superseded: "
              f"{entry['reason']}")
        for failure in earlier.get("failures", [])[:4]:
            print(f"        was: {failure}")
    print(f"GREEN: {record['green']}")


def merge_records(records: list[dict[str, Any]], reruns: dict[str, str] | None = None) -> dict[str, Any]:
    """One record from checks of the same tree on the same device and software, each running other stages
    (for sessions whose device calls are shorter than the whole check). Green only when together they ran
    every stage, each passed, and no tree changed while its check ran; every call is listed. A stage named
    in ``reruns`` (stage -> why it ran again) may run in several checks: the last result counts, and every
    earlier one stays in the record under ``superseded``, with the reason, for a reviewer to weigh."""
    reruns = reruns or {}
    first = records[0]
    problems = []
    for record in records[1:]:
        if record.get("tree_hash") != first.get("tree_hash"):
            problems.append(f"tree hashes differ: {first.get('tree_hash')} and {record.get('tree_hash')}")
        if record.get("environment") != first.get("environment"):
            problems.append("the checks ran on different devices or software: "
                            f"{first.get('environment')} and {record.get('environment')}")
    stages: dict[str, Any] = {}
    superseded: list[dict[str, Any]] = []
    for record in records:
        if record.get("partial"):
            problems.append(f"a check did not finish (partial record of {', '.join(record.get('stages', {}))})")
        if record.get("tree_hash_after", record.get("tree_hash")) != record.get("tree_hash"):
            problems.append("the tree changed while a check ran")
        for stage, result in record.get("stages", {}).items():
            if stage in stages and stage in reruns:
                superseded.append({"stage": stage, "reason": reruns[stage], "result": stages[stage]})
            elif stage in stages:
                problems.append(f"stage {stage} ran in more than one check")
            stages[stage] = result
    ordered = {stage: stages[stage] for stage in STAGE_LIMITS if stage in stages}
    missing = [stage for stage in STAGE_LIMITS if stage not in stages]
    if missing:
        problems.append(f"no check ran: {', '.join(missing)}")
    once = sorted(set(reruns) - {entry["stage"] for entry in superseded})
    if once:
        problems.append(f"named as run again, but ran once: {', '.join(once)}")
    return {"tree_hash": first.get("tree_hash"), "environment": first.get("environment"),
            "stages_run": list(ordered), "started": min(str(r.get("started")) for r in records),
            "seconds": round(sum(float(r.get("seconds", 0)) for r in records), 1), "stages": ordered,
            "tree_hash_after": first.get("tree_hash"),
            "calls": [{"started": r.get("started"), "seconds": r.get("seconds"), "stages": list(r.get("stages", {}))}
                      for r in records],
            "superseded": superseded,
            "problems": problems, "green": not problems and all(r["passed"] for r in ordered.values())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hash", action="store_true", help="print the tree hash and exit (no torch needed)")
    parser.add_argument("--stages", default=",".join(STAGE_LIMITS), help=f"comma-separated of {', '.join(STAGE_LIMITS)}")
    parser.add_argument("--json", default=str(RESULT), help="where to write the record")
    parser.add_argument("--logs", default=None, help="folder for logs (default: a temporary folder)")
    parser.add_argument("--out", default=None, help="folder for benchmark results (default: beside the logs)")
    parser.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                        help="combine records of the same tree that ran other stages into --json (no GPU needed)")
    parser.add_argument("--rerun", action="append", default=[], metavar="STAGE=WHY",
                        help="with --merge: STAGE ran again in a later record, because WHY; the last result counts "
                             "and the earlier ones are kept in the record under 'superseded'")
    ns = parser.parse_args(argv)
    if ns.hash:
        print(tree_hash())
        return 0
    if ns.merge:
        reruns = dict(item.split("=", 1) for item in ns.rerun if "=" in item)
        if len(reruns) != len(ns.rerun) or not all(reruns.values()):
            parser.error("--rerun takes STAGE=WHY, with a reason")
        record = merge_records([json.loads(Path(p).read_text()) for p in ns.merge], reruns)
        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.json).write_text(json.dumps(record, indent=1, default=str) + "\n")
        print_table(record)
        for problem in record["problems"]:
            print(f"problem: {problem}")
        return 0 if record["green"] else 1
    stages = [s for s in ns.stages.split(",") if s]
    unknown = [s for s in stages if s not in STAGE_LIMITS]
    if unknown:
        parser.error(f"unknown stage(s) {', '.join(unknown)}; choose from {', '.join(STAGE_LIMITS)}")
    started = time.time()
    digest = tree_hash()
    logs = Path(ns.logs) if ns.logs else Path(tempfile.mkdtemp(prefix="gpu_check-"))
    logs.mkdir(parents=True, exist_ok=True)
    out = Path(ns.out) if ns.out else logs / "results"
    out.mkdir(parents=True, exist_ok=True)
    env = environment()
    if env["arch"] == "cpu":
        print("gpu_check needs a CUDA GPU; none is visible (use --hash on a CPU)", file=sys.stderr)
        return 2
    def partial(results: dict[str, Any]) -> None:  # a check killed at its limit still leaves what it measured
        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.json).write_text(json.dumps({"tree_hash": digest, "environment": env, "partial": True,
                                             "stages": results, "green": False}, indent=1, default=str) + "\n")

    results = run_stages(stages, env["arch"], logs, out, partial)
    record = {"tree_hash": digest, "environment": env, "stages_run": stages,
              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
              "seconds": round(time.time() - started, 1), "stages": results,
              "tree_hash_after": tree_hash(),
              "green": all(r["passed"] for r in results.values()) and stages == list(STAGE_LIMITS)}
    if record["tree_hash_after"] != digest:
        record["green"] = False
        record.setdefault("problems", []).append("the tree changed while the check ran (files under hashed paths)")
    Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
    Path(ns.json).write_text(json.dumps(record, indent=1, default=str) + "\n")
    print_table(record)
    return 0 if record["green"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
