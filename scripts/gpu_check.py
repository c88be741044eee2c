#!/usr/bin/env python3
"""The GPU check, unit by unit: every GPU suite, the benchmarks with targets, the agent loop end to end and the
plugin's own tests on the GPU host, each result keyed by what its run read.

CI runs on a CPU, so a change can be green there while the GPU gates are red. Work that passes CI lands on
main whether or not a GPU was at hand; ``benchmarks/results/gpu_check.json`` says which results still hold for
the tree, and the next stretch of work with a GPU pays what does not (the debt) first.

A stage is made of units (``gpu_stages.py``): each test file of the ``plugin``, ``suites`` and ``corpus``
stages, and each of the ``fidelity``, ``kernels``, ``dit`` and ``loop`` stages whole. Every run is recorded:
each process of it notes the files it reads and the code it runs (``read_recorder/``), and a unit's inputs are
what it read, closed over imports (``gpu_inputs.py``). A unit's key is the sha256 of its inputs, of the
environment that computes (arch, torch, CUDA, triton, Python, the optional packages it looked up; a benchmark's
device too) and of the stage's definition (``gpu_record.py``). So a change costs the units that read it.

- ``--verify`` (any machine, no torch): exit 0 when every unit of every stage is fresh and passed on this tree
  (green), 1 when one ran on this tree and failed (red), 3 when some have not run on it (debt); names each.
- ``--plan`` (any machine): the units this tree must run, packed into device calls of at most 10 minutes with
  their set-up, and the device time in all (``--budget-s``: what fits the time at hand; ``--json``).
- ``--changed`` (a CUDA machine): run the units in debt (``--budget-s``: those that fit) and merge their results;
  the next ``--changed`` call, given the record this one wrote, picks up the rest.
- ``--stages A,B`` (a CUDA machine): the debt of the named stages only. A red unit runs again only when its
  stage is named with the reason (``--rerun STAGE=WHY``): the new result counts, and the earlier one stays
  under ``superseded``.
- ``--gpus N``: on a machine of several GPUs, run a call's parts on a lane per GPU (at most N; ``gpu_lanes.py``);
  with ``--plan``, plan for a machine of N GPUs (default 1).
- ``--explain UNIT``: a unit's inputs, key and state. ``--hash``: the tree hash (provenance).

Logs and recordings go to ``--logs`` (default: a temporary folder).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_inputs  # noqa: E402 - what a unit read, standard library only
import gpu_lanes  # noqa: E402 - a lane per GPU on a machine of several, standard library only
import gpu_record  # noqa: E402 - the record's keys and states, standard library only
import gpu_stages  # noqa: E402 - what each stage runs

STAGES = gpu_stages.STAGES
BY_NAME = gpu_stages.BY_NAME
RESULT = ROOT / "benchmarks" / "results" / "gpu_check.json"

#: optional distributions whose presence changes what a unit runs, by distribution name -> the names a run
#: looks them up by (module or distribution). A unit's key holds the versions of those it looked up.
OPTIONAL_PACKAGES = {
    "diffusers": ("diffusers",),
    "quack-kernels": ("quack", "quack_kernels"),
    "nvidia-cutlass-dsl": ("cutlass", "nvidia_cutlass_dsl"),
    "lpips": ("lpips",),
    "open-clip-torch": ("open_clip", "open_clip_torch"),
    "import-linter": ("importlinter", "import_linter"),
}
#: one device call: its limit, what each call costs beside its stages (setting up the packages and the project,
#: 3-6 s; the tree's transfer and the gap to the next call, 6-7 s), the margin left (the call stops the check at
#: 540 s, gpu_check_call.sh's GPU_CHECK_CALL_S, and packs what comes back), the check's own start before its
#: first stage (the device's environment, the tree's hashes: about 25 s on an H100,
#: benchmarks/results/gpu_check_h100_1207c/), and what a machine costs once (its start and the
#: 30 s it stays held after its last call: 62, 77 and 82 s for the three machines of seven H100 calls,
#: benchmarks/results/gpu_check_h100_1207/README.md)
CALL_LIMIT_S = 600
CALL_SETUP_S = 15
CALL_MARGIN_S = 45
CHECK_START_S = 25
MACHINE_START_S = 80
#: a stage is not started with less of the call left than this (its set-up alone would use it)
MIN_STAGE_S = 30.0
#: a test file never timed counts this much; a test stage's fixed cost (start, collection) until measured; a
#: whole stage never timed on this record, its usual time (on an H200 or H100; its limit is what stops it)
DEFAULT_UNIT_S = 15.0
DEFAULT_OVERHEAD_S = {"plugin": 30.0, "suites": 45.0, "corpus": 20.0}
DEFAULT_WHOLE_S = {"fidelity": 120.0, "kernels": 80.0, "dit": 110.0, "memory": 90.0, "switches": 120.0,
                   "probe_cost": 150.0}


# -- the machine ------------------------------------------------------------------------------------------

def environment() -> dict[str, Any]:
    """The device and software a result was computed on (what keys it: gpu_record.environment_key)."""
    import torch

    info: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                            "python": ".".join(sys.version.split()[0].split(".")[:2]),
                            "python_full": sys.version.split()[0], "cores": os.cpu_count()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(device=props.name, arch=f"sm_{props.major}{props.minor}", memory_gb=round(props.total_memory / 2**30, 1),
                    device_count=torch.cuda.device_count())
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


def optional_packages() -> dict[str, str | None]:
    """The installed version of each optional package (None: missing)."""
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str | None] = {}
    for name in OPTIONAL_PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def packages_reached(modules: set[str]) -> set[str]:
    """The optional distributions among the modules and distributions a unit looked up."""
    normal = {m.lower().replace("-", "_") for m in modules}
    return {dist for dist, names in OPTIONAL_PACKAGES.items()
            if normal & {dist.replace("-", "_"), *names}}


def load_record(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except ValueError as exc:
        raise SystemExit(f"gpu_check: {path} is not JSON ({exc}); restore it from git") from exc


def tree_hash(root: Path | None = None) -> str:
    """sha256 over every hashed file's relative path and bytes, in sorted order (provenance of a record)."""
    root = root or ROOT
    return gpu_record.digest(gpu_record.hashed_files(root), root)


# -- planning -------------------------------------------------------------------------------------------

@dataclass
class Part:
    """Some units of one stage, run together in one device call."""

    stage: gpu_record.Stage
    units: list[gpu_record.UnitState] = field(default_factory=list)
    seconds: float = 0.0


def overhead(record: dict[str, Any], stage: gpu_record.Stage, units: int) -> float:
    """A test stage's cost beyond its tests' own time for ``units`` test files: a fixed part (start, workers)
    and a part per file (its collection, the workers' imbalance), fitted to the stage's recorded runs; with runs
    of one size only, their median; with none, a default."""
    runs = ((record.get("stages") or {}).get(stage.name) or {}).get("runs") or []
    points = [(r["units"], max(0.0, r["wall_s"] - max(r["unit_s"] / max(1, r["workers"]), r["longest_s"])))
              for r in runs if {"units", "wall_s", "unit_s", "workers", "longest_s"} <= set(r)]
    if not points:
        return DEFAULT_OVERHEAD_S.get(stage.name, 30.0)
    if len({n for n, _ in points}) < 2:
        return statistics.median(extra for _, extra in points)
    mean_n = statistics.fmean(n for n, _ in points)
    mean_e = statistics.fmean(e for _, e in points)
    slope = sum((n - mean_n) * (e - mean_e) for n, e in points) / sum((n - mean_n) ** 2 for n, _ in points)
    slope = max(0.0, slope)
    fixed = max(0.0, mean_e - slope * mean_n)
    return fixed + slope * units


def unit_seconds(state: gpu_record.UnitState) -> float:
    if state.seconds is not None:
        return float(state.seconds)
    if state.stage.kind == "tests":
        return DEFAULT_UNIT_S
    if state.unit in gpu_stages.SHARD_ESTIMATE_S:  # an agent-loop shard: its steps as measured on an H100
        return gpu_stages.SHARD_ESTIMATE_S[state.unit]
    whole = DEFAULT_WHOLE_S.get(state.stage.name, float(state.stage.limit_s))
    return whole / max(1, len(state.stage.shards))


def longest_test(state: gpu_record.UnitState) -> float:
    """The longest single test of a test file, where its last result recorded one; else the file's whole time
    (a lower bound on a part's time only when the file's tests may run on several xdist workers at once)."""
    longest = ((state.entry or {}).get("result") or {}).get("longest_s")
    return float(longest) if isinstance(longest, (int, float)) else unit_seconds(state)


def estimate(record: dict[str, Any], stage: gpu_record.Stage, units: list[gpu_record.UnitState]) -> float:
    """A part's time: a whole stage's units one after the other; a test stage's fixed cost, and its tests'
    time shared among its workers, but never less than its longest file (one worker) or, on several workers,
    which share out single tests, its longest test."""
    if not units:
        return 0.0
    if stage.kind != "tests":
        return sum(unit_seconds(u) for u in units)
    times = [unit_seconds(u) for u in units]
    workers = min(stage.workers, len(units))
    floor = max(times) if workers == 1 else max(longest_test(u) for u in units)
    return overhead(record, stage, len(units)) + max(sum(times) / workers, floor)


def with_legacy_times(record: dict[str, Any], states: list[gpu_record.UnitState]) -> list[gpu_record.UnitState]:
    """Estimates for units never timed, from a schema-2 record's stage times (a stage's time shared among its
    units), so that the first plan after the change of schema packs its calls by measured times."""
    if record.get("schema") != 2:
        return states
    for stage in STAGES:
        seconds = (((record.get("stages") or {}).get(stage.name) or {}).get("result") or {}).get("seconds")
        mine = [s for s in states if s.stage is stage and s.seconds is None]
        if seconds is None or not mine:
            continue
        if stage.kind == "tests":
            share = max(1.0, float(seconds) - DEFAULT_OVERHEAD_S.get(stage.name, 30.0)) * stage.workers / len(mine)
        else:
            share = float(seconds)
        for state in mine:
            state.seconds = round(share, 1)
    return states


def due(states: list[gpu_record.UnitState], reruns: dict[str, str] | None = None) -> list[gpu_record.UnitState]:
    """The units to run: those in debt, and the red ones of stages named with a reason."""
    reruns = reruns or {}
    return [s for s in states if s.status == "debt" or (s.status == "red" and s.stage.name in reruns)]


def pack(record: dict[str, Any], todo: list[gpu_record.UnitState], capacity: float) -> list[list[Part]]:
    """``todo`` in stage order, packed into calls whose estimated time fits ``capacity``; a test stage's
    units may be split over calls (each part paying the stage's fixed cost)."""
    calls: list[list[Part]] = [[]]

    def used(call: list[Part]) -> float:
        return sum(part.seconds for part in call)

    for stage in STAGES:
        mine = [s for s in todo if s.stage is stage]
        if not mine:
            continue
        if stage.kind != "tests":
            for state in mine:  # a stage of shards may spread over calls, a shard at a time
                need = estimate(record, stage, [state])
                if used(calls[-1]) + need > capacity and calls[-1]:
                    calls.append([])
                calls[-1].append(Part(stage, [state], need))
            continue
        part = Part(stage)
        calls[-1].append(part)
        for state in sorted(mine, key=unit_seconds, reverse=True):
            grown = estimate(record, stage, part.units + [state])
            if used(calls[-1]) - part.seconds + grown > capacity and (part.units or len(calls[-1]) > 1):
                if not part.units:  # the stage's first unit does not fit beside the call's earlier stages
                    calls[-1].pop()
                calls.append([])
                part = Part(stage)
                calls[-1].append(part)
                grown = estimate(record, stage, [state])
            part.units.append(state)
            part.seconds = grown
    return [call for call in calls if call and any(part.units for part in call)]


def lane_parts(record: dict[str, Any], todo: list[gpu_record.UnitState], capacity: float) -> list[Part]:
    """``todo`` as parts that each fit a lane: a whole stage's units one by one, a test stage's units split as
    ``pack`` splits them over calls."""
    parts: list[Part] = []
    for stage in STAGES:
        mine = [s for s in todo if s.stage is stage]
        parts += [part for call in pack(record, mine, capacity) for part in call if part.units]
    return parts


def lane_load(parts: list[Part]) -> float:
    return sum(part.seconds for part in parts)


def cheapest_lane(calls: list[list[list[Part]]], part: Part, capacity: float) -> tuple[int, int] | None:
    """The (call, lane) where ``part`` fits and lengthens its call (its longest lane) least; ties go to the
    earlier call, then the emptier lane. None when it fits no lane."""
    best: tuple[tuple[float, int, float], tuple[int, int]] | None = None
    for number, call in enumerate(calls):
        longest = max(lane_load(lane) for lane in call)
        for index, lane in enumerate(call):
            load = lane_load(lane) + part.seconds
            if load > capacity:
                continue
            rank = (max(longest, load) - longest, number, load)
            if best is None or rank < best[0]:
                best = (rank, (number, index))
    return best[1] if best else None


def pack_lanes(record: dict[str, Any], todo: list[gpu_record.UnitState], capacity: float,
               lanes: int) -> list[list[list[Part]]]:
    """``todo`` packed into calls of ``lanes`` lanes (a lane per GPU), each lane's parts run one after another
    within ``capacity``: the longest part first, each where it lengthens the calls least (a call lasts as long
    as its longest lane), a new call when it fits no lane. One lane: ``pack``'s calls, in stage order."""
    if lanes <= 1:
        return [[call] for call in pack(record, todo, capacity)]
    calls: list[list[list[Part]]] = []
    for part in sorted(lane_parts(record, todo, capacity), key=lambda p: p.seconds, reverse=True):
        place = cheapest_lane(calls, part, capacity)
        if place is None:
            calls.append([[] for _ in range(lanes)])
            place = (len(calls) - 1, 0)
        calls[place[0]][place[1]].append(part)
    return calls


def call_row(call: list[list[Part]]) -> dict[str, Any]:
    """A call of the plan: its lanes' parts (the empty lanes left out), each lane's seconds, and the call's
    seconds (its longest lane and the set-up)."""
    lanes = [[{"stage": p.stage.name, "units": [u.unit for u in p.units], "seconds": round(p.seconds, 1)}
              for p in lane if p.units] for lane in call]
    lanes = [lane for lane in lanes if lane]
    lane_s = [round(sum(p["seconds"] for p in lane), 1) for lane in lanes]
    return {"parts": [p for lane in lanes for p in lane], "lanes": lanes, "lane_s": lane_s,
            "seconds": round(max(lane_s, default=0.0) + CALL_SETUP_S, 1)}


def stage_capacity(call_s: float) -> float:
    """The seconds of stages one call of ``call_s`` device seconds holds: less the call's set-up and margin, the
    check's start, and the harvest a stage keeps before the call's stop (``gpu_stages.time_for``)."""
    return call_s - CALL_SETUP_S - CALL_MARGIN_S - CHECK_START_S - gpu_stages.HARVEST_S


def plan_summary(record: dict[str, Any], states: list[gpu_record.UnitState], reruns: dict[str, str] | None = None,
                 call_s: float = CALL_LIMIT_S, leave_out: set[str] | None = None, gpus: int = 1) -> dict[str, Any]:
    """The calls a tree needs on a machine of ``gpus`` GPUs: each call's lanes and parts and its estimated
    seconds (its longest lane and the set-up), and the device time in all with one machine start.
    ``leave_out``: units (``stage:unit``) not to count."""
    todo = [s for s in due(states, reruns) if f"{s.stage.name}:{s.unit}" not in (leave_out or set())]
    rows = [call_row(call) for call in pack_lanes(record, todo, stage_capacity(call_s), gpus)]
    rows = [row for row in rows if row["parts"]]
    work = sum(r["seconds"] for r in rows)
    red = [f"{s.stage.name}: {s.unit}" for s in states if s.status == "red" and s not in todo]
    stage_s = sum(p["seconds"] for r in rows for p in r["parts"])
    return {"units": len(todo), "stages": sorted({s.stage.name for s in todo}, key=lambda n: list(BY_NAME).index(n)),
            "unit_ids": [f"{s.stage.name}:{s.unit}" for s in todo], "calls": rows, "device_s": round(work + (MACHINE_START_S if rows else 0), 1), "work_s": round(work, 1),
            "stage_s": round(stage_s, 1), "red_not_rerun": red, "gpus": gpus}


def print_parts(parts: list[dict[str, Any]], indent: str) -> None:
    for part in parts:
        shown = ", ".join(part["units"][:4]) + (f" (+{len(part['units']) - 4} more)" if len(part["units"]) > 4 else "")
        print(f"{indent}{part['stage']:9s} {len(part['units']):3d} unit(s), about {part['seconds']:.0f} s: {shown}")


def print_plan(summary: dict[str, Any]) -> None:
    if not summary["calls"]:
        print("0 units to run on a GPU: the record covers this tree" +
              (f" (red, not run again without --rerun: {', '.join(summary['red_not_rerun'])})"
               if summary["red_not_rerun"] else ""))
        return
    gpus = summary.get("gpus", 1)
    where = "a GPU" if gpus == 1 else f"{gpus} GPUs (a lane each)"
    print(f"{summary['units']} units of {', '.join(summary['stages'])} to run on {where}: about "
          f"{summary['device_s']:.0f} s of device time in {len(summary['calls'])} call(s) "
          f"(each at most {CALL_LIMIT_S} s, {CALL_SETUP_S} s of set-up in each; {MACHINE_START_S} s to start a machine)")
    for number, call in enumerate(summary["calls"], 1):
        if gpus == 1:
            print(f"  call {number}, about {call['seconds']:.0f} s:")
            print_parts(call["parts"], "    ")
            continue
        print(f"  call {number}, about {call['seconds']:.0f} s, {len(call['lanes'])} lane(s) in parallel:")
        for lane, (parts, seconds) in enumerate(zip(call["lanes"], call["lane_s"]), 1):
            print(f"    lane {lane}, about {seconds:.0f} s:")
            print_parts(parts, "      ")
    if summary["red_not_rerun"]:
        print(f"  red, not run again without --rerun STAGE=WHY: {', '.join(summary['red_not_rerun'])}")


# -- running ----------------------------------------------------------------------------------------------

def tree_hashes(root: Path) -> gpu_record.Hashes:
    """Every file's hash before a run (what ran), so that an input changed during the run is seen."""
    hashes = gpu_record.Hashes(root)
    for parent, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in gpu_inputs.SKIPPED_PARTS and not d.endswith(".egg-info")]
        for name in names:
            rel = (Path(parent) / name).relative_to(root).as_posix()
            if not gpu_inputs.ignored(rel):
                hashes(rel)
    return hashes


def derive(stage: gpu_record.Stage, units: list[str], folder: Path, graph: gpu_inputs.ImportGraph,
           root: Path) -> dict[str, tuple[list[str], set[str], str | None]]:
    """Per unit: its inputs, the optional packages it reached, and why its reads are incomplete (None: they
    are complete): its own file was never read under it, or it started a Python process without the
    recorder."""
    if stage.kind != "tests" and len(units) != 1:
        raise ValueError(f"{stage.name}: a whole stage's reads are derived one unit (one recording) at a time")
    recording = gpu_inputs.Recording.load(folder)
    reads = gpu_inputs.unit_reads(recording, root, whole=units[0] if stage.kind != "tests" else None)
    out = {}
    for unit in units:
        found = reads.get(unit)
        extra = [unit, *gpu_inputs.conftests(unit, root)] if stage.kind == "tests" else list(stage.paths)
        recorded = found is not None and any(f == unit or f in extra for f in found.files) if stage.kind == "tests" \
            else found is not None and bool(found.files)
        found = found or gpu_inputs.UnitReads()
        gap = None
        if not recorded:
            gap = "its reads were not recorded (a process ran without the recorder): its inputs are unknown"
        elif found.blind:
            gap = (f"it started a Python process without the recorder ({found.blind[0][:160]}"
                   + (f"; +{len(found.blind) - 1} more" if len(found.blind) > 1 else "") + "): its inputs are unknown")
        out[unit] = (gpu_inputs.unit_inputs(found, graph, extra), packages_reached(found.modules), gap)
    return out


@dataclass
class Ran:
    """What one part's run left: a result per unit that ran to its end, the recordings its units' inputs come
    from (a test stage: one for all its units; a whole stage: one per unit), its wall time and start."""

    stage: gpu_record.Stage
    units: list[str]
    results: dict[str, dict[str, Any]]
    recordings: list[tuple[list[str], Path]]
    wall: float
    started: str


def run_units(stage: gpu_record.Stage, units: list[str], arch: str, logs: Path, out: Path,
              lane: gpu_lanes.Lane | None = None, estimates: dict[str, float] | None = None) -> Ran:
    """Run ``units`` of ``stage`` recorded (on ``lane``'s GPU and cores, where the machine has several).
    ``estimates``: each unit's expected seconds; a unit recorded only when it ends (a whole stage's, or the one
    file of a test stage: the corpus's shards) starts only with that much of the call left, since a stop
    before its end records nothing and spends the device time."""
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    where = f"[gpu_check{f' lane {lane.index}' if lane else ''}]"

    def too_late(what: str, unit: str | None = None) -> bool:
        need = MIN_STAGE_S if unit is None else max(MIN_STAGE_S, min((estimates or {}).get(unit, 0.0), stage.limit_s))
        left = gpu_stages.time_for(stage.limit_s)[0]
        if left >= need:
            return False
        print(f"{where} {what}: not started, too little of the call is left ({left:.0f} s for about {need:.0f} s); "
              "it stays in debt", flush=True)
        return True

    if too_late(stage.name, units[0] if stage.kind == "tests" and len(units) == 1 else None):
        return Ran(stage, units, {}, [], 0.0, started)
    print(f"{where} {stage.name}: {len(units)} unit(s) ...", flush=True)
    if stage.kind == "tests":
        recorded = gpu_stages.Recorded(logs, stage.name, lane)
        results, wall = gpu_stages.run_tests(stage, units, logs, recorded)
        return Ran(stage, units, results, [(units, recorded.folder)], wall, started)
    results, recordings, wall = {}, [], 0.0  # a whole stage's units (its shards), one after the other
    for unit in units:
        if too_late(unit, unit):
            break
        recorded = gpu_stages.Recorded(logs, unit, lane)
        result = gpu_stages.run_whole(stage, unit, arch, logs, out, recorded)
        wall += float(result.get("seconds", 0.0))
        if result.get("stopped"):
            print(f"{where} {unit}: stopped by {result['stopped']}; it stays in debt", flush=True)
            break
        results[unit] = result
        recordings.append(([unit], recorded.folder))
    return Ran(stage, units, results, recordings, wall, started)


def merge_ran(record: dict[str, Any], ran: Ran, env: dict[str, Any], before: gpu_record.Hashes,
              graph: gpu_inputs.ImportGraph, reruns: dict[str, str], lanes_beside: int | None = None) -> dict[str, Any]:
    """Merge a result per unit of ``ran`` into ``record``, with the inputs its recording shows; a unit whose
    inputs changed since ``before`` or whose reads are unknown fails. ``lanes_beside``: the other lanes busy
    while it ran (a benchmark's provenance)."""
    stage, units, results = ran.stage, ran.units, ran.results
    derived: dict[str, tuple[list[str], set[str], str | None]] = {}
    for recorded_units, folder in ran.recordings:
        derived.update(derive(stage, recorded_units, folder, graph, ROOT))
    after = gpu_record.Hashes(ROOT)
    record.setdefault("schema", gpu_record.SCHEMA)
    snapshot = gpu_record.snapshot_of(record, {f for inputs, _, _ in derived.values() for f in inputs}, before,
                                      ran.started)
    unjudged = [unit for unit in units if unit not in results]
    if unjudged:
        print(f"[gpu_check] {stage.name}: {len(unjudged)} unit(s) stopped at the time limit before all their tests "
              f"ran; they stay in debt: {', '.join(unjudged[:6])}" + (" ..." if len(unjudged) > 6 else ""), flush=True)
    unit_env = dict(env, lanes_beside=lanes_beside) if stage.per_device and lanes_beside is not None else env
    for unit in (u for u in units if u in results):
        inputs, packages, gap = derived[unit]
        result = dict(results[unit])
        changed = [f for f in inputs if after(f) != before(f)]
        if changed:
            result["passed"] = False
            result.setdefault("failures", []).insert(0, f"its inputs changed while it ran: {', '.join(changed[:4])}")
        if gap:
            result["passed"] = False
            result.setdefault("failures", []).insert(0, gap)
        result["inputs"] = len(inputs)
        record = gpu_record.merge_unit(record, stage, unit, inputs, packages, unit_env, result, ran.started, snapshot,
                                       before, reruns.get(stage.name))
    if stage.kind == "tests" and not unjudged:  # a stopped run's times are not the stage's
        times = [results[u]["seconds"] for u in units]
        gpu_record.add_run(record, stage, {"started": ran.started, "wall_s": round(ran.wall, 1), "units": len(units),
                                           "unit_s": round(sum(times), 1), "longest_s": max(times, default=0.0),
                                           "workers": min(stage.workers, len(units)), "device": env.get("device")})
    print(f"[gpu_check] {stage.name}: {sum(results[u]['passed'] for u in results)}/{len(units)} passed in "
          f"{ran.wall:.0f} s", flush=True)
    return record


def run_part(record: dict[str, Any], part: Part, env: dict[str, Any], logs: Path, out: Path,
             reruns: dict[str, str]) -> dict[str, Any]:
    """Run the units of ``part`` recorded, and merge a result per unit into ``record`` (one GPU)."""
    before = tree_hashes(ROOT)
    graph = gpu_inputs.ImportGraph(ROOT)
    ran = run_units(part.stage, [u.unit for u in part.units], env["arch"], logs, out,
                    estimates={u.unit: unit_seconds(u) for u in part.units})
    return merge_ran(record, ran, env, before, graph, reruns)


def run_on_lanes(record: dict[str, Any], call: list[list[Part]], lanes: list[gpu_lanes.Lane], env: dict[str, Any],
                 logs: Path, out: Path, reruns: dict[str, str], save: Callable[[dict[str, Any]], dict[str, Any]]
                 ) -> dict[str, Any]:
    """Run a call's lanes in parallel, a lane per GPU, each in its own folder of ``logs``; merge each part
    into ``record`` here, as it finishes, and ``save`` the record after each (a call stopped by SIGINT keeps
    what finished)."""
    before = tree_hashes(ROOT)  # the whole call's: an input changed while any part ran is seen
    graph = gpu_inputs.ImportGraph(ROOT)
    merged = {"record": record}

    def run(lane: gpu_lanes.Lane, part: Part) -> Ran:
        folder = lane.folder(logs)
        folder.mkdir(parents=True, exist_ok=True)
        return run_units(part.stage, [u.unit for u in part.units], env["arch"], folder, out, lane,
                         {u.unit: unit_seconds(u) for u in part.units})

    def done(part: Part, ran: Ran, lanes_beside: int) -> None:
        merged["record"] = save(merge_ran(merged["record"], ran, env, before, graph, reruns, lanes_beside))

    gpu_lanes.run_lanes([(lane, parts) for lane, parts in zip(lanes, call) if parts], run, done)
    return merged["record"]


def save_record(record: dict[str, Any], path: Path) -> dict[str, Any]:
    """Write ``record`` (units that no longer exist dropped, the tree's hash noted) to ``path``, atomically: the
    lane threads' merges and a reader between them see whole records only."""
    record = gpu_record.forget_missing(record, STAGES, ROOT)
    record["tree_hash"] = tree_hash()
    from pytest_ditgate.fsutil import atomic_write_text  # a stop mid-write leaves the record before it

    atomic_write_text(path, json.dumps(record, indent=1, default=str) + "\n")
    return record


def lane_count(env: dict[str, Any], cap: int | None) -> int:
    """How many lanes a run gets: the machine's GPUs, at most ``cap``."""
    return max(1, min(int(env.get("device_count") or 1), cap or sys.maxsize))


def print_table(record: dict[str, Any], states: list[gpu_record.UnitState], title: str) -> None:
    print(f"\n=== {title} ===")
    for stage in STAGES:
        mine = [s for s in states if s.stage is stage]
        counts = {k: sum(s.status == k for s in mine) for k in ("fresh", "red", "debt")}
        status = "RED" if counts["red"] else "DEBT" if counts["debt"] else "PASS"
        tests = [((s.entry or {}).get("result") or {}).get("counts") or {} for s in mine if s.status == "fresh"]
        detail = ""
        if tests:
            detail = "  tests " + "/".join(str(sum(t.get(k, 0) for t in tests)) for k in ("passed", "failed", "skipped")) \
                + " passed/failed/skipped"
        elif mine and mine[0].entry and mine[0].status != "debt":
            targets = (mine[0].entry.get("result") or {}).get("targets") or []
            detail = f"  {sum(t['pass'] for t in targets)}/{len(targets)} targets"
        print(f"{status:5s} {stage.name:9s} {counts['fresh']}/{len(mine)} units fresh{detail}")
        for state in [s for s in mine if s.status != "fresh"][:8]:
            print(f"        {state.status} {state.unit}: {state.why}")


def run_check(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    record_path, out_path = Path(ns.record), Path(ns.json or ns.record)
    record = load_record(record_path)
    if record.get("schema") != gpu_record.SCHEMA:
        record = {}
    reruns = dict(item.split("=", 1) for item in ns.rerun if "=" in item)
    if len(reruns) != len(ns.rerun) or not all(reruns.values()):
        parser.error("--rerun takes STAGE=WHY, with a reason")
    named = [s for s in (ns.stages or "").split(",") if s] + [s for s in reruns if s not in (ns.stages or "").split(",")]
    unknown = [s for s in named if s not in BY_NAME]
    if unknown:
        parser.error(f"unknown stage(s) {', '.join(unknown)}; choose from {', '.join(BY_NAME)}")
    try:
        env = environment()
    except ImportError as exc:
        print(f"gpu_check needs torch with CUDA to run stages ({exc}); use --verify or --plan without it",
              file=sys.stderr)
        return 2
    if env["arch"] == "cpu":
        print("gpu_check needs a CUDA GPU; none is visible (use --verify or --plan on a CPU)", file=sys.stderr)
        return 2
    states = with_legacy_times(load_record(record_path), gpu_record.states(record, STAGES, ROOT, env))
    todo = [s for s in due(states, reruns) if not named or s.stage.name in named]
    capacity = ns.budget_s if ns.budget_s is not None else float("inf")
    left, _ = gpu_stages.time_for(capacity)
    capacity = min(capacity, left)  # with --call-s: what fits before the call stops the check, less the harvest
    lanes = lane_count(env, ns.gpus)
    calls = pack_lanes(record, todo, capacity, lanes)
    now = calls[0] if calls else []
    chosen = {id(u) for lane in now for part in lane for u in part.units}
    later = [s for s in todo if id(s) not in chosen]
    for stage in STAGES:
        mine = [s for s in states if s.stage is stage]
        runs = sum(id(s) in chosen for s in mine)
        print(f"[gpu_check] {stage.name:9s} {len(mine)} units: {sum(s.status == 'fresh' for s in mine)} fresh, "
              f"{sum(s.status == 'red' for s in mine)} red, {sum(s.status == 'debt' for s in mine)} debt; running {runs}",
              flush=True)
    logs = Path(ns.logs) if ns.logs else Path(tempfile.mkdtemp(prefix="gpu_check-"))
    out = Path(ns.out) if ns.out else logs / "results"
    out.mkdir(parents=True, exist_ok=True)
    if lanes > 1:
        print(f"[gpu_check] {lanes} GPUs: a lane each, their logs in lane-N folders", flush=True)
        record = run_on_lanes(record, now, gpu_lanes.machine_lanes(lanes), env, logs, out, reruns,
                              lambda merged: save_record(merged, out_path))
    stopped = None
    try:
        for part in now[0] if lanes == 1 and now else []:
            if not part.units:
                continue
            stopped = part.stage.name
            record = save_record(run_part(record, part, env, logs, out, reruns), out_path)
            stopped = None
    except KeyboardInterrupt:  # the call's limit: what finished is saved; the stage that was running stays debt
        print(f"[gpu_check] stopped while {stopped or 'a stage'} ran: its units keep their earlier state",
              flush=True)
    record = save_record(record, out_path)
    final = gpu_record.states(record, STAGES, ROOT, env)
    print_table(record, final, f"gpu_check on {env.get('device')} ({env.get('arch')}), tree {tree_hash()[:12]}")
    if later:
        print(f"left for the next --changed call: {len(later)} unit(s) of "
              f"{', '.join(sorted({s.stage.name for s in later}))}")
    red = [f"{s.stage.name}: {s.unit}" for s in final if s.status == "red"]
    if red:
        print(f"red, not run again without --rerun STAGE=WHY: {', '.join(red[:8])}")
    verdict, _ = gpu_record.verify(record, STAGES, ROOT)
    print(f"GREEN: {verdict == 'green'} ({verdict})")
    return {"green": 0, "red": 1, "debt": 3}[verdict]


def explain(record: dict[str, Any], unit: str) -> int:
    hashes = gpu_record.Hashes(ROOT)
    found = False
    for stage in STAGES:
        if unit not in stage.units(ROOT):
            continue
        found = True
        state = gpu_record.unit_state(record if record.get("schema") == gpu_record.SCHEMA else {}, stage, unit, hashes)
        print(f"{stage.name}: {unit}: {state.status}" + (f" ({state.why})" if state.why else ""))
        if state.entry:
            inputs = gpu_record.entry_inputs(record, state.entry)
            print(f"  key {state.entry.get('key')}\n  inputs_sha256 {state.entry.get('inputs_sha256')} (now "
                  f"{gpu_record.inputs_digest(inputs, hashes)})\n  environment {json.dumps(state.entry.get('environment'))}"
                  f"\n  provenance {json.dumps(state.entry.get('provenance'))}\n  {len(inputs)} inputs:")
            for rel in inputs:
                print(f"    {rel}")
    if not found:
        print(f"{unit} is a unit of no stage (units: test files of {', '.join(s.name for s in STAGES if s.kind == 'tests')};"
              f" stages {', '.join(s.name for s in STAGES if s.kind != 'tests')})")
        return 2
    return 0


def audit(folder: Path) -> int:
    """A recorded run's gaps (``scripts/test`` records the README's tests): the test files that started a Python
    process without the recorder. Such a unit's inputs would be unknown in a GPU check, which fails it; CI
    fails first, naming the process."""
    reads = gpu_inputs.unit_reads(gpu_inputs.Recording.load(folder), ROOT)
    gaps = {unit: found.blind for unit, found in reads.items() if found.blind and unit.startswith("tests/")}
    units = sum(1 for unit in reads if unit.startswith("tests/"))
    if not gaps:
        print(f"gpu_check --audit: every process of {units} test files was recorded")
        return 0
    for unit, blind in sorted(gaps.items()):
        print(f"gpu_check --audit: {unit} started a Python process without the GPU check's recorder: {blind[0][:200]}"
              + (f" (+{len(blind) - 1} more)" if len(blind) > 1 else ""))
    print("keep GPUCHECK_RECORD_* and the recorder's folder on PYTHONPATH in the environment of the processes a test "
          "starts (README, \"The GPU check\")")
    return 1


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()  # a call's --call-s counts from here, as the call's timeout does from the start
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hash", action="store_true", help="print the tree hash and exit (no torch needed)")
    parser.add_argument("--verify", action="store_true",
                        help="exit 0 when every unit is fresh and passed on this tree, 1 red, 3 debt (no torch)")
    parser.add_argument("--plan", action="store_true",
                        help="the device calls this tree needs (no torch); with --budget-s, what fits")
    parser.add_argument("--explain", metavar="UNIT", help="a unit's inputs, key and state (a test file or a stage)")
    parser.add_argument("--audit", metavar="DIR", help="the gaps of a recorded run (no torch): exit 1 when a test "
                                                      "started a Python process without the recorder")
    parser.add_argument("--changed", action="store_true", help="run the units in debt (on a CUDA machine)")
    parser.add_argument("--stages", default=None, help=f"comma-separated stages to run, of {', '.join(BY_NAME)}")
    parser.add_argument("--rerun", action="append", default=[], metavar="STAGE=WHY",
                        help="also run STAGE's red units again, because WHY; the earlier results stay in the record "
                             "under 'superseded'")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="run (or plan) only the units whose estimated times fit this many seconds")
    parser.add_argument("--leave-out", default=None, metavar="JSON",
                        help="with --plan: a JSON list of units (stage:unit) to leave out of the plan")
    parser.add_argument("--gpus", type=int, default=None, metavar="N",
                        help="run on at most N of the machine's GPUs, a lane each (default: all); with --plan, plan "
                             "for a machine of N GPUs (default 1)")
    parser.add_argument("--call-s", type=float, default=None, metavar="S",
                        help="the device call stops this check S seconds after it started (gpu_check_call.sh's "
                             "limit): a stage started near then stops itself first, so that its finished files "
                             "are recorded")
    parser.add_argument("--record", default=str(RESULT), help="the record to read (default: the committed one)")
    parser.add_argument("--json", default=None,
                        help="where to write the merged record (default: --record); with --plan, the plan as JSON")
    parser.add_argument("--logs", default=None, help="folder for logs and recordings (default: a temporary folder)")
    parser.add_argument("--out", default=None, help="folder for benchmark results (default: beside the logs)")
    ns = parser.parse_args(argv)
    if ns.hash:
        print(tree_hash())
        return 0
    if ns.audit:
        return audit(Path(ns.audit))
    if ns.verify or ns.plan or ns.explain:
        record = load_record(Path(ns.record))
        if ns.explain:
            return explain(record, ns.explain)
        if ns.plan:
            states = with_legacy_times(record, gpu_record.states(record, STAGES, ROOT))
            leave_out = set(json.loads(Path(ns.leave_out).read_text())) if ns.leave_out else None
            gpus = ns.gpus or 1
            summary = plan_summary(record, states, call_s=CALL_LIMIT_S, leave_out=leave_out, gpus=gpus)
            if ns.budget_s is not None:
                fits = pack_lanes(record, due(states), stage_capacity(ns.budget_s), gpus)
                summary["fits_budget"] = [{"stage": p.stage.name, "units": [u.unit for u in p.units]}
                                          for lane in (fits[0] if fits else []) for p in lane if p.units]
            if ns.json:
                Path(ns.json).write_text(json.dumps(summary, indent=1) + "\n")
            print_plan(summary)
            if ns.budget_s is not None:
                shown = ", ".join(f"{p['stage']} ({len(p['units'])})" for p in summary["fits_budget"]) or "nothing"
                print(f"within {ns.budget_s:.0f} s: {shown}")
            return 0
        verdict, lines = gpu_record.verify(record, STAGES, ROOT)
        print("\n".join(lines))
        shown = Path(ns.record).resolve()
        where = shown.relative_to(ROOT) if shown.is_relative_to(ROOT) else shown
        words = {"green": "the record covers this tree: every unit fresh and passed",
                 "red": "red: a unit ran on this tree and failed",
                 "debt": "debt: units have not run on this tree (run gpu_check.py --changed on a GPU)"}
        print(f"gpu_check --verify: {words[verdict]} ({where})")
        return {"green": 0, "red": 1, "debt": 3}[verdict]
    if not ns.changed and not ns.stages and not ns.rerun:
        parser.error("say what to run: --changed, --stages A,B or --rerun STAGE=WHY (or --verify, --plan, --hash)")
    gpu_stages.CALL_DEADLINE = started + ns.call_s if ns.call_s else None
    return run_check(ns, parser)


if __name__ == "__main__":
    raise SystemExit(main())
