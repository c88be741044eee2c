"""The GPU check's stages: what each runs on the GPU machine, and the rules that judge its results.

Every run is recorded (``read_recorder/``): each process of it writes what it read, so that each unit's
result is keyed by the files it depended on (``gpu_inputs.py``, ``gpu_record.py``). A test stage runs only
the test files it is given (its stale units) and returns a result per file; a whole stage returns one.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable

import agent_loop_check
import gpu_lanes
from gpu_record import Stage

ROOT = Path(__file__).resolve().parent.parent
RECORDER = Path(__file__).resolve().parent / "read_recorder"

#: the tolerance corpus (it times nothing): this many pytest processes share one GPU, each a shard
CORPUS = "tests/gates/test_tolerance_corpus_gpu.py"
CORPUS_SHARDS = 6
#: the plugin stage's tests (everything that is not a GPU suite), on this many xdist workers at most (12 of a GPU
#: host's 16 cores: the rest for the processes its tests start)
PLUGIN_TESTS = ("tests/plugin", "tests/dit_impl")
PLUGIN_WORKERS = 12
#: the suites stage's tests: every other test file, in one pytest process (GPU tests share one device);
#: suite names for its counts
SUITES = {
    "kernels": ["tests/gates/kernels", "tests/kernels"],
    "correctness": ["tests/gates/test_correctness_gpu.py"],
    "device": ["tests/gates/test_device_gate.py"],
    "bench": ["tests/gates/test_bench_gpu.py"],
    "fast_dit": ["tests/dit_fast"],
    "dit_gates": ["tests/gates/dit"],
}
#: the forward configurations dit_bench times in the check: the candidate lane's honest win, the fastest
#: set, seamed, and seamed with quack's GEMMs, QKV and fc1 or fc1 only (where quack-kernels is missing they
#: fall back to cuBLAS, and dit_bench's record says so in the case's report)
DIT_CONFIGS = ("cuda_graphs=1,gelu_epilogue=1,adaln=kernels,sdpa=cudnn;cuda_graphs=1;"
               "cuda_graphs=1,gelu_epilogue=1,adaln=kernels,sdpa=cudnn,block_seam=1;"
               "cuda_graphs=1,gelu_epilogue=1,adaln=kernels,sdpa=cudnn,block_seam=1,gemm=quack;"
               "cuda_graphs=1,gelu_epilogue=1,adaln=kernels,sdpa=cudnn,block_seam=1,gemm=quack_fc1")
BENCH_ARGS = {
    "fidelity": ["--runs", "3"],
    "kernels": ["--dtypes", "bf16,fp32", "--budget-s", "60"],
    "dit": ["--reps", "30", "--configs", DIT_CONFIGS],
    "memory": [],
    "switches": [],
    "probe_cost": ["--device", "cuda", "--repeats", "3"],
}
#: functions whose reads and lookups make no result depend on what they read: hashing the fixed paths against
#: their lock (which every CPU run, CI's too, verifies as well), noting package versions as provenance, and
#: copying a tree (what the run then reads from the copy counts as read from the original; a program other
#: than Python reading the copy, git for one, is not seen)
IGNORE_IN = ("src/pytest_ditgate/golden/fixed_paths.py:expand,table_digest,evaluate_lock;"
             "src/pytest_ditgate/environment.py:environment_record;"
             "/shutil.py:copytree,_copytree")


# -- running, recorded ------------------------------------------------------------------------------------

class Recorded:
    """A folder for one stage run's recording and the environment that starts the recorder in every process.
    The recorder's modules are copied outside the project (the judge refuses ``PYTHONPATH`` entries inside
    it that are not fixed folders). On a machine of several GPUs, ``lane`` is the GPU and cores the run's
    processes get."""

    def __init__(self, logs: Path, stage: str, lane: gpu_lanes.Lane | None = None) -> None:
        self.lane = lane
        self.folder = logs / f"record-{stage}"
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(parents=True)
        self.code = Path(tempfile.mkdtemp(prefix="gpucheck-recorder-"))
        for name in ("sitecustomize.py", "gpucheck_recorder.py"):
            shutil.copy2(RECORDER / name, self.code / name)

    def bare_env(self, **extra: str) -> dict[str, str]:
        """A process's environment without the recorder (on the run's lane)."""
        return child_env(**(self.lane.env() if self.lane else {}), **extra)

    def env(self, unit: str | None = None, **extra: str) -> dict[str, str]:
        env = self.bare_env(**extra)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.code), env.get("PYTHONPATH", "")]))
        env["GPUCHECK_RECORD_DIR"] = str(self.folder)
        env["GPUCHECK_RECORD_IGNORE_IN"] = IGNORE_IN
        if unit:
            env["GPUCHECK_RECORD_UNIT"] = unit
        else:
            env.pop("GPUCHECK_RECORD_UNIT", None)
        return env


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1", **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


#: when the device call stops this check (``time.monotonic()``; None: no call limit). A stage started near it
#: runs only until ``HARVEST_S`` before it, so that a test stage stops itself and keeps each file that finished,
#: instead of being cut with nothing recorded
CALL_DEADLINE: float | None = None
#: what a stage stopped at its limit needs before the call's own stop: pytest's grace to write its JUnit XML
#: (``stop_group``), the merge of the results, and the record
HARVEST_S = 45.0


def time_for(limit_s: float) -> tuple[float, bool]:
    """The seconds a stage with limit ``limit_s`` may run from now, and whether the call's deadline cut it."""
    if CALL_DEADLINE is None:
        return limit_s, False
    left = CALL_DEADLINE - HARVEST_S - time.monotonic()
    return (left, True) if left < limit_s else (limit_s, False)


def run_logged(command: list[str], log: Path, limit: float, env: dict[str, str], cwd: Path = ROOT) -> tuple[int, float]:
    """Run ``command`` with its output in ``log``; (exit code, seconds). 124 when it ran past ``limit``."""
    codes, seconds = run_logged_together([(command, log, env)], limit, cwd)
    return codes[0], seconds


def run_logged_together(runs: list[tuple[list[str], Path, dict[str, str]]], limit: float,
                        cwd: Path = ROOT) -> tuple[list[int], float]:
    """Start every ``(command, log, env)`` at once; their exit codes (124 for one still running ``limit``
    seconds after the start, killed with its process group) and the seconds until the last ended."""
    start = time.monotonic()
    started = []
    for command, log, env in runs:
        out = log.open("w")
        process = subprocess.Popen(gpu_lanes.pinned(command, env), cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                   env=env, start_new_session=True)
        gpu_lanes.GROUPS.started(process)  # a stop of the lanes kills it
        started.append((process, out))
    codes = []
    try:
        for process, out in started:
            try:
                codes.append(process.wait(timeout=max(0.0, start + limit - time.monotonic())))
            except subprocess.TimeoutExpired:
                stop_group(process)
                out.write(f"\n[gpu_check] stopped after {limit:.0f} s\n")
                codes.append(124)
            gpu_lanes.GROUPS.ended(process)
            out.close()
    except BaseException:  # interrupted (the call's own limit): leave no process group running on the GPU
        for process, _ in started:
            gpu_lanes.kill_group(process.pid)
            gpu_lanes.GROUPS.ended(process)
        raise
    return codes, time.monotonic() - start


def stop_group(process: subprocess.Popen, grace_s: float = 25.0) -> None:
    """Stop a run past its limit: SIGINT first, so that pytest reports the failures and durations so far and
    writes its JUnit XML, then SIGKILL to the whole process group after ``grace_s``."""
    try:
        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=grace_s)
    except (OSError, subprocess.TimeoutExpired):
        pass
    gpu_lanes.kill_group(process.pid)
    process.wait()


# -- test stages: a result per test file ----------------------------------------------------------------------

def in_tree_order(paths: list[str] | tuple[str, ...]) -> list[str]:
    """The test files sorted by their path's parts, so that every directory's files are adjacent on pytest's
    command line: pytest 9.1 loses a nested conftest's fixtures for files given after a file of another
    directory ("fixture 'tiny_model' not found" on the GPU machine's pytest; pytest-dev/pytest#14971)."""
    return sorted(paths, key=lambda path: Path(path).parts)


def pytest_command(xml: Path, durations: int, units: list[str], *options: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "--ditgate", "-p", "no:cacheprovider", "-q", "-rfEs",
            f"--durations={durations}", f"--junitxml={xml}", "-o", "junit_family=xunit1", *options,
            *in_tree_order(units)]


def _empty() -> dict[str, Any]:
    return {"passed": 0, "failed": 0, "skipped": 0, "errors": 0, "seconds": 0.0, "longest_s": 0.0, "failures": [],
            "skips": []}


def junit_units(xml: Path) -> dict[str, dict[str, Any]]:
    """Per test file (the JUnit ``file`` attribute, relative to the root): counts, summed test time, its longest
    test's time, failures (nodeid: first line) and skip reasons."""
    units: dict[str, dict[str, Any]] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        path = case.get("file") or case.get("classname", "").replace(".", "/") + ".py"
        unit = units.setdefault(path, _empty())
        unit["seconds"] += float(case.get("time") or 0.0)
        unit["longest_s"] = max(unit["longest_s"], float(case.get("time") or 0.0))
        nodeid = f"{path}::{case.get('name')}"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed" if child.tag == "failure" else "errors"
                message = (child.get("message") or child.text or "").replace(f"{ROOT}/", "").strip().splitlines()
                unit["failures"].append(f"{nodeid}: {message[0][:300] if message else child.tag}")
            elif child.tag == "skipped":
                outcome = "skipped"
                if len(unit["skips"]) < 5:
                    unit["skips"].append(f"{nodeid}: {(child.get('message') or '')[:200]}")
        unit[outcome] += 1
    return units


def collected_counts(units: list[str], env: dict[str, str], log: Path, limit: float = 180.0) -> dict[str, int] | None:
    """How many tests pytest collects from each unit (``--co``, without the recorder; its output in ``log``): a
    run stopped at its limit then credits the units whose every test ran. None when the collection fails."""
    command = [sys.executable, "-m", "pytest", "--ditgate", "-p", "no:cacheprovider", "--co", "-q",
               *in_tree_order(units)]
    code, _ = run_logged(command, log, limit, env)
    if code not in (0, 5):
        return None
    counts: dict[str, int] = {}
    for line in log.read_text(errors="replace").splitlines():
        path, sep, _ = line.partition("::")
        if sep and path in units:
            counts[path] = counts.get(path, 0) + 1
    return counts


def unit_results(units: list[str], codes: list[int], xmls: list[Path],
                 collected: dict[str, int] | None = None) -> dict[str, dict[str, Any]]:
    """A result per unit from the runs' JUnit XML: a unit passes when its tests ran, none failed and the run
    that held it ended normally (pytest's 0 or 1). A run stopped at its time limit (124) still judges each unit
    whose every collected test ran (``collected``); the others get no result (they stay in debt for the next
    call, where a result would make them red)."""
    merged = {unit: _empty() for unit in units}
    problems: list[str] = []
    for code, xml in zip(codes, xmls):
        if not xml.exists():
            problems.append(f"no JUnit XML {xml.name} (exit {code}): see {xml.stem}.log")
            continue
        for path, found in junit_units(xml).items():
            target = merged.setdefault(path, _empty())
            for key in ("passed", "failed", "skipped", "errors", "seconds"):
                target[key] += found[key]
            target["longest_s"] = max(target["longest_s"], found["longest_s"])
            target["failures"] += found["failures"]
            target["skips"] += found["skips"][: max(0, 5 - len(target["skips"]))]
        if code not in (0, 1):
            problems.append(f"pytest exited {code}" + (" (time limit)" if code == 124 else "") + f": see {xml.stem}.log")
    cut = 124 in codes
    results = {}
    for unit in units:
        found = merged[unit]
        unit_problems = problems
        if cut:
            ran = sum(found[k] for k in ("passed", "failed", "skipped", "errors"))
            if collected is None or not collected.get(unit) or ran < collected[unit]:
                continue  # stopped before all of its tests ran: no result
            unit_problems = [p for p in problems if "(time limit)" not in p]
        failures = list(found["failures"]) + unit_problems
        ran = found["passed"] + found["skipped"]
        if not ran and not failures:
            failures.append("no test of it ran")
        results[unit] = {"passed": not failures and found["failed"] + found["errors"] == 0 and ran > 0,
                         "seconds": round(found["seconds"], 1), "longest_s": round(found["longest_s"], 1),
                         "counts": {k: found[k] for k in ("passed", "failed", "skipped", "errors")},
                         "failures": failures[:20], "skips": found["skips"]}
    return results


def run_plugin(units: list[str], logs: Path, limit: float, recorded: Recorded) -> tuple[dict[str, dict], float]:
    """The plugin's own tests and the workloads' CPU tests on the GPU host, in xdist workers (one torch thread
    each, as on a CI machine), the ``gpu_check``-marked ones too."""
    xml = logs / "plugin.xml"
    command = pytest_command(xml, 20, units, "-n", str(plugin_workers(len(units), recorded.lane)))
    started = time.monotonic()
    collected = collected_counts(units, recorded.bare_env(OMP_NUM_THREADS="1"), logs / "plugin-collect.log")
    left = limit - (time.monotonic() - started)
    code, seconds = run_logged(command, logs / "plugin.log", left, recorded.env(OMP_NUM_THREADS="1"))
    return unit_results(units, [code], [xml], collected), time.monotonic() - started


def plugin_workers(units: int, lane: gpu_lanes.Lane | None) -> int:
    """The plugin stage's xdist workers: one per unit, at most ``PLUGIN_WORKERS``, and at most its lane's cores."""
    return max(1, min(PLUGIN_WORKERS, units, len(lane.cpus) if lane else PLUGIN_WORKERS))


def run_suites(units: list[str], logs: Path, limit: float, recorded: Recorded) -> tuple[dict[str, dict], float]:
    """The GPU suites in one pytest process (they share the device)."""
    xml = logs / "suites.xml"
    started = time.monotonic()
    collected = collected_counts(units, recorded.bare_env(), logs / "suites-collect.log")
    left = limit - (time.monotonic() - started)
    code, seconds = run_logged(pytest_command(xml, 20, units), logs / "suites.log", left, recorded.env())
    return unit_results(units, [code], [xml], collected), time.monotonic() - started


def run_corpus(units: list[str], logs: Path, limit: float, recorded: Recorded,
               shards: int = CORPUS_SHARDS) -> tuple[dict[str, dict], float]:
    """The tolerance corpus as ``shards`` parallel pytest processes (nothing in it is timed, so sharing the GPU
    cannot change a verdict); counts merged from their JUnit XML."""
    xmls = [logs / f"corpus_{index}.xml" for index in range(shards)]
    runs = [(pytest_command(xml, 10, units), xml.with_suffix(".log"),
             recorded.env(DITGATE_CORPUS_SHARD=f"{index}/{shards}")) for index, xml in enumerate(xmls)]
    codes, seconds = run_logged_together(runs, limit)
    results = unit_results(units, codes, xmls)
    for result in results.values():  # its tests ran in parallel shards: the time they held the machine
        result["seconds"] = round(result["seconds"] / shards, 1)
    return results, seconds


# -- whole stages: benchmarks with targets, the agent loop ----------------------------------------------------

def targets_from(path: Path, convert: Callable[[dict], list[dict]]) -> tuple[list[dict], list[str]]:
    if not path.exists():
        return [], [f"{path.name} was not written"]
    try:
        return convert(json.loads(path.read_text())), []
    except (ValueError, KeyError, TypeError) as exc:
        return [], [f"{path.name}: cannot read targets ({type(exc).__name__}: {exc})"]


def benchmark_stage(script: str, args: list[str], result_name: str, convert: Callable[[dict], list[dict]],
                    logs: Path, limit: float, out: Path, env: dict[str, str]) -> dict[str, Any]:
    code, seconds = run_logged([sys.executable, f"benchmarks/{script}", "--out", str(out), *args],
                               logs / f"{Path(script).stem}.log", limit, env)
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


def memory_targets(data: dict) -> list[dict]:
    """One check_kernel at LLM sizes: it passes, and the host's peak grows by at most the benchmark's multiple
    of the inputs (the device peak is reported, not held to a target)."""
    limit = float(data["host_target_x_inputs"])
    out = []
    for result in data["results"]:
        case = result["case"]
        out.append(_target(f"{case}: check_kernel passed", bool(result.get("passed")), "True",
                           bool(result.get("passed"))))
        growth = result.get("host_peak_delta_x_inputs")
        out.append(_target(f"{case}: host peak growth / inputs",
                           round(growth, 2) if growth is not None else f"not measured ({result.get('error', '')})",
                           f"<= {limit}", growth is not None and growth <= limit))
    return out


def switches_targets(data: dict) -> list[dict]:
    """Torch's reduced-precision switches on the corpus's GEMMs and convolutions: each caught wherever it changes
    the result, passing where declared, and no false alarm with it off."""
    out = []
    for switch, s in data["summary"].items():
        name = switch.removeprefix("torch.backends.")
        out.append(_target(f"{name}: caught where it changes the result ({s['changes_result']} of {s['cases']})",
                           s["caught_where_it_changes"], f"== {s['changes_result']}",
                           s["caught_where_it_changes"] == s["changes_result"]))
        out.append(_target(f"{name}: declared passes", s["declared_passed"], f"== {s['cases']}",
                           s["declared_passed"] == s["cases"]))
        out.append(_target(f"{name}: false alarms with it off", s["false_alarms_switch_off"], "== 0",
                           s["false_alarms_switch_off"] == 0))
    return out


def probe_cost_targets(data: dict) -> list[dict]:
    """check_kernel's cost with the precision probe against without it, on the corpus."""
    return [_target(f"{setting}: cost with the probe", round(s["ratio"], 3), f"<= {s['target']}",
                    s["ratio"] <= s["target"]) for setting, s in data["summary"].items() if s.get("target")]


def _target(name: str, value: Any, limit: str, passed: bool) -> dict[str, Any]:
    return {"name": name, "value": value, "limit": limit, "pass": bool(passed)}


def classes_targets(data: dict) -> list[dict]:
    """The classes script's targets (exit code and judged class per candidate) in the stages' form."""
    return [_target(t["name"], f"exit {t['exit']}, judged {t.get('judged')}",
                    " or ".join(map(str, t["expected"])) + (f", judged {t['expected_class']}"
                                                           if t.get("expected_class") else ""), t["pass"])
            for t in data["targets"]]


#: the stages that run a script of the agent loop: (script, its arguments, its targets in the stages' form)
LOOP_SCRIPTS: dict[str, tuple[str, list[str], Callable[[dict], list[dict]]]] = {
    "loop": ("scripts/agent_loop_check.py", [], lambda d: d["targets"]),
    "attacks": ("scripts/agent_loop_attacks.py", [], lambda d: d["targets"]),
    "empty": ("scripts/agent_loop_empty.py", [], lambda d: d["targets"]),
    "classes": ("scripts/agent_loop_classes.py", [], classes_targets),
}


def stage_script(name: str, logs: Path, limit: float, env: dict[str, str], unit: str | None = None,
                 shard: tuple[str, ...] = ()) -> dict[str, Any]:
    """A loop script's stage (or one shard of it: ``unit``, run with the ``shard`` arguments): it writes
    ``<unit>.json`` with its targets (and the verdict's first reasons where one failed); the unit passes when
    the script exits 0 and every target holds."""
    script, args, convert = LOOP_SCRIPTS[name]
    unit = unit or name
    code, seconds = run_logged([sys.executable, script, *args, *shard, "--json", str(logs / f"{unit}.json")],
                               logs / f"{unit}.log", limit, env)
    targets, failures = targets_from(logs / f"{unit}.json", convert)
    failures += [f"{t['name']}: got {t['value']}, expected {t['limit']}"
                 + (f" ({'; '.join(t['reasons'])[:300]})" if t.get("reasons") else "")
                 for t in targets if not t["pass"]]
    if code != 0 and not failures:
        failures.append(f"{script} exited {code}: see {unit}.log")
    return {"rc": code, "seconds": round(seconds, 1), "targets": targets, "failures": failures,
            "passed": code == 0 and bool(targets) and not failures}


#: what the agent-loop stages' steps take on an H100 (this tree's judge, the DiT lane; measured by the GPU check's
#: calls of 2026-12-07): a baseline in a fresh copy of the project (two runs of the lane, the judge timing it),
#: an experiment the judge times (four regions, two comparisons each, 32-40 rounds), one refused before the
#: judge times it, one the judge refuses while it times (an attack caught in the rounds: about 57 s a run in
#: benchmarks/results/gpu_check_h100_1207/call6_attacks.log), a plain run of the lane's tests, and the untimed
#: run that builds the kernels first
JUDGED_STEP_S = {"baseline": 165.0, "timed": 115.0, "refused": 30.0, "caught": 60.0, "plain": 40.0, "build": 60.0}


def judged_steps_s(*steps: str) -> float:
    """A shard's estimated seconds: its steps' (``JUDGED_STEP_S``), the baseline included by the caller."""
    return sum(JUDGED_STEP_S[step] for step in steps)


#: the empty stage: twenty empty commits judged on the DiT lane, at least 19 of them 11 (issue 46's target).
#: Each is an experiment the judge times, so two of them and their baseline fill a device call: the stage runs
#: as ten shards of two, each with its own baseline; a shard allows one run that is not 11, and the shards
#: together are held to 19 of 20
EMPTY_RUNS, EMPTY_SHARD_RUNS = 20, 2
EMPTY_SHARDS = tuple((f"{start}-{start + EMPTY_SHARD_RUNS - 1}",
                      ("--runs", str(EMPTY_SHARD_RUNS), "--min-discards", str(EMPTY_SHARD_RUNS - 1)))
                     for start in range(1, EMPTY_RUNS + 1, EMPTY_SHARD_RUNS))


def empty_across_shards(results: dict[str, dict[str, Any]]) -> list[str]:
    """The empty stage's rule over its shards: every run judged, and at least 19 of the 20 are 11."""
    targets = [t for result in results.values() for t in result.get("targets") or []]
    runs = sum(int(t.get("runs") or 0) for t in targets)
    discards = sum(int(t.get("value") or 0) for t in targets)
    need = EMPTY_RUNS - EMPTY_RUNS // 20
    if runs >= EMPTY_RUNS and discards >= need:
        return []
    return [f"empty commits judged 11: {discards} of {runs} across the shards; at least {need} of {EMPTY_RUNS} "
            "must be"]


#: the attacks stage: eight attacks and an empty commit, each judged on the DiT lane after a baseline: the first
#: seven are caught while the judge times them, the forged evidence and the empty commit are timed in full (11);
#: three shards, each with its baseline within a device call
ATTACK_SHARDS = (("1-4", ("--pick", "1-4")), ("5-7", ("--pick", "5-7")), ("8-9", ("--pick", "8-9")))


#: the loop stage, a shard per part of the loop (agent_loop_check.PARTS), each after a baseline of its own: the
#: empty commit and the verdicts never ask for the adaLN kernels, so a change to kernels/ re-runs only the honest
#: candidate's part; the judge's cost is judged over the parts' runs
LOOP_SHARDS = tuple((part, ("--part", part)) for part in agent_loop_check.PARTS)


#: the classes stage: the DiT lane's eight candidates in four shards (the fp8 candidate is two timed experiments:
#: a speedup first, then fp8 on top) and the kernel lane's three, each shard with a baseline of its lane
CLASSES_SHARDS = (("dit-1-3", ("--lane", "dit", "--pick", "1-3")), ("dit-4-5", ("--lane", "dit", "--pick", "4-5")),
                  ("dit-6", ("--lane", "dit", "--pick", "6")), ("dit-7-8", ("--lane", "dit", "--pick", "7-8")),
                  ("kernels", ("--lane", "kernels")))

#: each shard's estimated seconds on an H100, before the check has timed it (``JUDGED_STEP_S``)
SHARD_ESTIMATE_S = {
    "loop[empty]": judged_steps_s("baseline", "plain", "timed", "plain"),
    "loop[verdicts]": judged_steps_s("baseline", "timed", "refused", "refused", "refused"),
    "loop[kernels]": judged_steps_s("baseline", "build", "plain", "timed", "plain"),
    "attacks[1-4]": judged_steps_s("baseline", "caught", "caught", "caught", "caught"),
    "attacks[5-7]": judged_steps_s("baseline", "caught", "caught", "caught"),
    "attacks[8-9]": judged_steps_s("baseline", "timed", "timed"),
    **{f"empty[{name}]": judged_steps_s("baseline", *["timed"] * EMPTY_SHARD_RUNS) for name, _ in EMPTY_SHARDS},
    # fp16 and TF32 timed, the scaled logits refused; the fewest steps timed, the most refused; a speedup and
    # fp8 on it; int8 timed, int4 refused; the fused seam timed, the gateless one refused, an empty commit timed
    "classes[dit-1-3]": judged_steps_s("baseline", "timed", "timed", "refused"),
    "classes[dit-4-5]": judged_steps_s("baseline", "timed", "refused"),
    "classes[dit-6]": judged_steps_s("baseline", "timed", "timed"),
    "classes[dit-7-8]": judged_steps_s("baseline", "timed", "refused"),
    "classes[kernels]": judged_steps_s("baseline", "timed", "refused", "timed"),
}


def _source(*functions: Callable[..., Any]) -> str:
    return "".join(inspect.getsource(f) for f in functions)


#: the stages in the order they run (the broadest and cheapest first, so that a defect shows before the long
#: stages spend device time); a test stage's units are its test files, the others are one unit each. Every
#: test file under tests/ is a unit of exactly one test stage.
STAGES = [
    # 520 s: on an H100 its 83 files ran 484 s and were stopped at 480 with one file left (a device call allows
    # 545 s of check after its set-up)
    Stage("plugin", "tests", PLUGIN_TESTS, f"pytest --ditgate -n <={PLUGIN_WORKERS} {' '.join(PLUGIN_TESTS)}",
          520, _source(unit_results), workers=PLUGIN_WORKERS),
    # 480 s: on an H100 the lane-classes tests alone took 150 s, and 300 s ran 6 of the 32 files
    Stage("suites", "tests", ("tests",), "pytest --ditgate <every other test file of tests/>", 480,
          _source(unit_results), exclude=(*PLUGIN_TESTS, CORPUS)),
    # 200 s: each of the six shards took 100-112 s of pytest on an H100, with rounding_bias and the LLM cases
    Stage("corpus", "tests", (CORPUS,), f"pytest --ditgate {CORPUS} in {CORPUS_SHARDS} shards", 200,
          _source(unit_results)),
    Stage("fidelity", "whole", ("benchmarks/timer_fidelity.py",),
          "benchmarks/timer_fidelity.py " + " ".join(BENCH_ARGS["fidelity"]), 200, _source(fidelity_targets),
          per_device=True),
    Stage("kernels", "whole", ("benchmarks/kernels_bench.py",),
          "benchmarks/kernels_bench.py " + " ".join(BENCH_ARGS["kernels"]), 120, _source(kernels_targets),
          per_device=True),
    Stage("dit", "whole", ("benchmarks/dit_bench.py",), "benchmarks/dit_bench.py " + " ".join(BENCH_ARGS["dit"]),
          150, _source(dit_targets, _target), per_device=True),
    Stage("memory", "whole", ("benchmarks/kernel_check_memory.py",), "benchmarks/kernel_check_memory.py", 300,
          _source(memory_targets, _target), per_device=True),
    Stage("switches", "whole", ("benchmarks/precision_probe_switches.py",), "benchmarks/precision_probe_switches.py",
          300, _source(switches_targets, _target), per_device=True),
    Stage("probe_cost", "whole", ("benchmarks/precision_probe_cost.py",),
          "benchmarks/precision_probe_cost.py " + " ".join(BENCH_ARGS["probe_cost"]), 300,
          _source(probe_cost_targets, _target), per_device=True),
    Stage("loop", "whole", ("scripts/agent_loop_check.py",), "scripts/agent_loop_check.py", 480,
          _source(stage_script, agent_loop_check.cost_across, agent_loop_check.cost_ratio), shards=LOOP_SHARDS,
          across_shards=agent_loop_check.cost_across),
    Stage("attacks", "whole", ("scripts/agent_loop_attacks.py",), "scripts/agent_loop_attacks.py", 480,
          _source(stage_script), shards=ATTACK_SHARDS),
    Stage("empty", "whole", ("scripts/agent_loop_empty.py",), "scripts/agent_loop_empty.py", 520,
          _source(stage_script, empty_across_shards), shards=EMPTY_SHARDS, across_shards=empty_across_shards),
    Stage("classes", "whole", ("scripts/agent_loop_classes.py",), "scripts/agent_loop_classes.py", 520,
          _source(stage_script, classes_targets, _target), shards=CLASSES_SHARDS),
]
BY_NAME = {stage.name: stage for stage in STAGES}
TEST_RUNNERS = {"plugin": run_plugin, "suites": run_suites, "corpus": run_corpus}


def run_tests(stage: Stage, units: list[str], logs: Path, recorded: Recorded) -> tuple[dict[str, dict], float]:
    """A test stage's files, within its limit or the call's: a run stopped at either judges the files whose
    every test ran (``unit_results``)."""
    return TEST_RUNNERS[stage.name](units, logs, time_for(stage.limit_s)[0], recorded)


def run_whole(stage: Stage, unit: str, arch: str, logs: Path, out: Path, recorded: Recorded) -> dict[str, Any]:
    """Run one unit of a whole stage (the stage, or one of its shards) and judge its targets. One that the call's
    deadline stopped, not its own limit, is ``stopped``: it has no result, and stays in debt."""
    limit, cut = time_for(stage.limit_s)
    result = _run_whole(stage, unit, arch, logs, out, recorded, limit)
    if cut and result.get("rc") == 124:
        result["stopped"] = "the device call's limit"
    return result


def _run_whole(stage: Stage, unit: str, arch: str, logs: Path, out: Path, recorded: Recorded,
               limit: float) -> dict[str, Any]:
    env = recorded.env(unit=unit)
    bench = {
        "fidelity": ("timer_fidelity.py", f"timer_fidelity_{arch}.json", fidelity_targets),
        "kernels": ("kernels_bench.py", f"kernels_bench_{arch}.json", kernels_targets),
        "dit": ("dit_bench.py", f"dit_bench_{arch}.json", dit_targets),
        "memory": ("kernel_check_memory.py", f"kernel_check_memory_{arch}.json", memory_targets),
        "switches": ("precision_probe_switches.py", f"precision_probe_switches_{arch}.json", switches_targets),
        "probe_cost": ("precision_probe_cost.py", f"precision_probe_cost_{arch}.json", probe_cost_targets),
    }
    if stage.name in bench:
        script, result_name, convert = bench[stage.name]
        return benchmark_stage(script, BENCH_ARGS[stage.name], result_name, convert, logs, limit, out, env)
    return stage_script(stage.name, logs, limit, env, unit, stage.shard_args(unit))
