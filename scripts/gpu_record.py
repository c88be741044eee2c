"""The GPU check's record, unit by unit: what each result depends on, and whether it still holds for a tree.

A stage is made of **units**: each test file of a test stage, or the whole stage (a benchmark, the agent loop).
A unit's **inputs** are the project files its last run read (``gpu_inputs.py``: recorded in every process of
the run, closed over imports); its **key** is the sha256 of the canonical JSON of ``{"inputs": inputs digest,
"environment": its environment key, "definition": the stage's definition}``. A result holds for a tree while
the key recomputed from that tree equals the recorded one:

- a change to a file no unit read leaves every key as it is (a run that never reaches ``experiment/`` is not
  keyed on it); a change to an input, or a new import in one, changes the key;
- correctness units are keyed by what computes (arch, torch, CUDA, triton, Python, and the optional packages
  the unit looked up), so a result from an H100 covers an H200 and the reverse; benchmark stages are records of
  one device each (the device's name is in their key, and the record keeps one result per device); the
  device's name, driver and memory stay in every entry as provenance.

A unit's state: ``fresh`` (its key matches and it passed), ``red`` (its key matches and it failed: it runs
again only when named with a reason), or ``debt`` (not run on this tree: no result, or another key).

Standard library only: ``gpu_check.py --verify`` and ``--plan`` run on any machine, without torch.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable

import gpu_inputs

#: the record format this module reads and writes
SCHEMA = 3
#: how a key is made, written into every record so that anyone can recompute one
KEY_SCHEME = ("key = sha256 of the canonical JSON (sorted keys, no spaces) of {\"inputs\": inputs_sha256, "
              "\"environment\": environment, \"definition\": the stage's definition}; inputs_sha256 = sha256 "
              "over each input's relative path and the sha256 of its bytes ('absent' for a missing file; for a "
              "file of PARTIAL_INPUTS, of the canonical JSON of the keys named there), in sorted order (gpu_record.inputs_digest); an entry's inputs are indexes into the record's "
              "'paths'; gpu_check.py --explain UNIT prints a unit's inputs and key")
#: the environment fields that key a correctness result: what computes (plus the optional packages reached)
COMPUTE_FIELDS = ("arch", "torch", "cuda", "triton", "python")
#: besides those, a benchmark result is keyed by its device
DEVICE_FIELDS = ("device",)
#: kept in every entry, never in a key (``lanes_beside``: on a machine of several GPUs, the most other lanes
#: busy at once while a benchmark ran: its timings shared the host with theirs)
PROVENANCE_FIELDS = ("device", "driver", "memory_gb", "python_full", "cores", "lanes_beside")
#: the paths whose changes the tree hash covers (provenance: the tree a record was made on)
HASHED_DIRS = ("src", "kernels", "dit_impl", "tests", "golden", "fixtures", "scripts")
HASHED_FILES = ("conftest.py", "pyproject.toml")
#: JSON files a run depends on only in part: the rest is a function of the tree that every CPU run (CI) checks.
#: The fixed-paths lock's ``files`` table hashes the fixed paths (a run whose lock does not match stops at its
#: start, on a CPU as on a GPU); its lanes' start records (the judge reads them) and patterns are its own.
PARTIAL_INPUTS = {"golden/fixed_paths.lock.json": ("version", "patterns", "lanes")}


@dataclass(frozen=True)
class Stage:
    """One stage of the check. ``tests``: a unit per test file under ``paths`` (minus ``exclude``), run by
    pytest; ``whole``: one unit, ``paths`` its start files, or one unit per shard (``shards``: a label and the
    arguments that run that share of it, for a stage longer than a device call). ``per_device``: a benchmark,
    a result per device. ``judged_by`` is the source of the rule that judges it, so that a changed rule makes it
    stale; ``across_shards`` judges the shards' results together (a list of problems, empty when they hold)."""

    name: str
    kind: str
    paths: tuple[str, ...]
    runs: str
    limit_s: int
    judged_by: str = ""
    exclude: tuple[str, ...] = ()
    per_device: bool = False
    workers: int = 1
    shards: tuple[tuple[str, tuple[str, ...]], ...] = ()
    across_shards: Callable[[dict[str, dict[str, Any]]], list[str]] | None = None

    def units(self, root: Path) -> list[str]:
        if self.kind != "tests":
            return [f"{self.name}[{label}]" for label, _ in self.shards] or [self.name]
        skip = tuple(self.exclude)
        return [u for u in gpu_inputs.walk_tests(root, self.paths)
                if not any(u == e or u.startswith(e.rstrip("/") + "/") for e in skip)]

    def definition(self) -> str:
        judged = hashlib.sha256(self.judged_by.encode()).hexdigest()[:16] if self.judged_by else None
        spec = {"kind": self.kind, "runs": self.runs, "judged_by": judged, "per_device": self.per_device}
        if self.shards:
            spec["shards"] = [[label, list(args)] for label, args in self.shards]
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]

    def shard_args(self, unit: str) -> tuple[str, ...]:
        """The arguments that run ``unit``'s share of a sharded stage (none for a stage of one unit)."""
        return next((args for label, args in self.shards if unit == f"{self.name}[{label}]"), ())

    def entry_id(self, unit: str, environment: dict[str, Any] | None) -> str:
        """Where a unit's result is kept: per device for a benchmark stage."""
        return f"{unit}@{(environment or {}).get('device')}" if self.per_device else unit


# -- files and digests -----------------------------------------------------------------------------------

class Hashes:
    """Each file's sha256 in a tree, computed once."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._cache: dict[str, str] = {}

    def __call__(self, rel: str) -> str:
        if rel not in self._cache:
            path = self.root / rel
            try:
                data = path.read_bytes() if path.is_file() else None
            except OSError:
                data = None
            if data is not None and rel in PARTIAL_INPUTS:
                data = _partial(data, PARTIAL_INPUTS[rel])
            self._cache[rel] = hashlib.sha256(data).hexdigest() if data is not None else "absent"
        return self._cache[rel]


def _partial(data: bytes, keys: tuple[str, ...]) -> bytes:
    """The canonical JSON of ``keys`` of a JSON object (the whole bytes when it is not one)."""
    try:
        loaded = json.loads(data)
    except ValueError:
        return data
    if not isinstance(loaded, dict):
        return data
    return json.dumps({k: loaded.get(k) for k in keys}, sort_keys=True, separators=(",", ":")).encode()


def inputs_digest(inputs: Iterable[str], hashes: Hashes) -> str:
    sha = hashlib.sha256()
    for rel in sorted(set(inputs)):
        sha.update(f"{len(rel)}:{rel}\0{hashes(rel)}\n".encode())
    return sha.hexdigest()


def unit_key(inputs_sha256: str, environment: dict[str, Any], definition: str) -> str:
    payload = {"inputs": inputs_sha256, "environment": environment, "definition": definition}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def environment_key(environment: dict[str, Any], stage: Stage, packages: Iterable[str]) -> dict[str, Any]:
    """The part of a machine's environment that keys ``stage``'s unit: what computes, the optional packages
    the unit reached (by distribution name), and the device for a benchmark."""
    fields = COMPUTE_FIELDS + (DEVICE_FIELDS if stage.per_device else ())
    key = {name: environment.get(name) for name in fields}
    installed = environment.get("packages") or {}
    key["packages"] = {name: installed.get(name) for name in sorted(set(packages)) if name in installed}
    return key


def provenance(environment: dict[str, Any]) -> dict[str, Any]:
    return {name: environment.get(name) for name in PROVENANCE_FIELDS if environment.get(name) is not None}


def hashed_files(root: Path) -> list[Path]:
    """Every file the tree hash covers (sources, tests, goldens, fixtures, scripts; no caches or docs)."""
    found = []
    for rel in HASHED_FILES:
        if (root / rel).is_file():
            found.append(root / rel)
    for folder in HASHED_DIRS:
        for parent, dirs, names in os.walk(root / folder):
            dirs[:] = sorted(d for d in dirs if d not in gpu_inputs.SKIPPED_PARTS and not d.endswith(".egg-info"))
            for name in names:
                path = Path(parent) / name
                if not gpu_inputs.ignored(path.relative_to(root).as_posix()):
                    found.append(path)
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def digest(files: Iterable[Path], root: Path) -> str:
    """sha256 over each file's relative path and bytes, in the given (sorted) order (the tree hash)."""
    sha = hashlib.sha256()
    for path in files:
        rel = path.relative_to(root).as_posix().encode()
        data = path.read_bytes()
        sha.update(b"%d:%s\0%d:" % (len(rel), rel, len(data)))
        sha.update(data)
    return sha.hexdigest()


# -- reading entries ------------------------------------------------------------------------------------

@dataclass
class UnitState:
    """A unit of a stage against a tree: ``fresh``, ``red`` or ``debt``, why, and its last measured time."""

    stage: Stage
    unit: str
    status: str
    why: str = ""
    seconds: float | None = None
    entry: dict[str, Any] | None = field(default=None, repr=False)


def entry_inputs(record: dict[str, Any], entry: dict[str, Any]) -> list[str]:
    paths = record.get("paths") or []
    return [paths[i] for i in entry.get("inputs", []) if 0 <= i < len(paths)]


def changed_inputs(record: dict[str, Any], entry: dict[str, Any], hashes: Hashes, most: int = 4) -> str:
    """'edited a, b; removed c' for a unit's inputs against the snapshot of the run that recorded them."""
    snapshot = (record.get("snapshots") or {}).get(entry.get("snapshot"), {})
    paths = record.get("paths") or []
    edited, removed, added = [], [], []
    for index in entry.get("inputs", []):
        rel = paths[index]
        then = snapshot.get(str(index))
        now = hashes(rel)
        if now == "absent" and then not in (None, "absent"):
            removed.append(rel)
        elif then == "absent" and now != "absent":
            added.append(rel)
        elif then is not None and now[:16] != then:
            edited.append(rel)
    parts, left = [], most
    for word, found in (("edited", edited), ("added", added), ("removed", removed)):
        if found:
            shown = found[:max(left, 1)]
            left -= len(shown)
            parts.append(f"{word} {', '.join(shown)}" + (f" (+{len(found) - len(shown)} more)" if len(found) > len(shown) else ""))
    return "; ".join(parts) or "its inputs changed"


def unit_state(record: dict[str, Any], stage: Stage, unit: str, hashes: Hashes,
               environment: dict[str, Any] | None = None) -> UnitState:
    """The state of ``unit`` for the tree behind ``hashes``. ``environment`` is the machine's when running: a
    unit then holds only if it was run on an environment with the same key (for a benchmark: this device);
    without it (``--verify``) each entry is checked against the environment it recorded."""
    entries = ((record.get("stages") or {}).get(stage.name) or {}).get("units") or {}
    if stage.per_device:
        candidates = [e for eid, e in entries.items() if eid.rpartition("@")[0] == unit]
    else:
        candidates = [entries[unit]] if unit in entries else []
    if not candidates:
        return UnitState(stage, unit, "debt", "no result recorded")
    states = [_entry_state(record, stage, unit, e, hashes, environment) for e in candidates]
    for wanted in ("fresh", "red"):
        for state in states:
            if state.status == wanted:
                return state
    if stage.per_device and environment is not None:
        # a benchmark holds on any device whose result matches the tree; the device at hand runs it only when
        # none does
        held = [s for s in (_entry_state(record, stage, unit, e, hashes, None) for e in candidates)
                if s.status == "fresh"]
        if held:
            return held[0]
    return states[0]


def _entry_state(record: dict[str, Any], stage: Stage, unit: str, entry: dict[str, Any], hashes: Hashes,
                 environment: dict[str, Any] | None) -> UnitState:
    result = entry.get("result") or {}
    seconds = result.get("seconds")
    env_key = entry.get("environment") or {}
    if environment is not None:
        now = environment_key(environment, stage, (env_key.get("packages") or {}).keys())
        if now != env_key:
            differ = sorted(k for k in set(now) | set(env_key) if now.get(k) != env_key.get(k))
            return UnitState(stage, unit, "debt", f"environment differs ({', '.join(differ)})", seconds, entry)
    if entry.get("definition") != stage.definition():
        return UnitState(stage, unit, "debt", "the stage's definition changed (what it runs or the rule that "
                                              "judges it)", seconds, entry)
    inputs = entry_inputs(record, entry)
    digest_now = inputs_digest(inputs, hashes)
    if unit_key(digest_now, env_key, stage.definition()) != entry.get("key"):
        why = changed_inputs(record, entry, hashes) if digest_now != entry.get("inputs_sha256") else "its key differs"
        return UnitState(stage, unit, "debt", why, seconds, entry)
    if not result.get("passed"):
        failures = result.get("failures") or ["not passed"]
        return UnitState(stage, unit, "red", f"{failures[0]}" + (f" (+{len(failures) - 1} more)" if len(failures) > 1 else ""),
                         seconds, entry)
    return UnitState(stage, unit, "fresh", "", seconds, entry)


def states(record: dict[str, Any], stages: list[Stage], root: Path,
           environment: dict[str, Any] | None = None) -> list[UnitState]:
    hashes = Hashes(root)
    record = record if record.get("schema") == SCHEMA else {}
    found: list[UnitState] = []
    for stage in stages:
        mine = [unit_state(record, stage, unit, hashes, environment) for unit in stage.units(root)]
        found += across_shards(stage, mine)
    return found


def across_shards(stage: Stage, mine: list[UnitState]) -> list[UnitState]:
    """A sharded stage's units, red together when each passed on this tree but their results together fail the
    stage's rule (twenty runs in two shards of ten are judged as twenty)."""
    if stage.across_shards is None or not mine or any(s.status != "fresh" for s in mine):
        return mine
    problems = stage.across_shards({s.unit: (s.entry or {}).get("result") or {} for s in mine})
    if not problems:
        return mine
    return [replace(s, status="red", why=problems[0]) for s in mine]


def _debt_time(owed: list[UnitState]) -> str:
    """The recorded test time of units still owed, and how many of them were never timed (no time to add)."""
    timed = [s.seconds for s in owed if s.seconds is not None]
    parts = [f"~{sum(timed):.0f} s of test time"] if timed else []
    if len(timed) < len(owed):
        parts.append(f"{len(owed) - len(timed)} never timed")
    return "; ".join(parts)


def verify(record: dict[str, Any], stages: list[Stage], root: Path) -> tuple[str, list[str]]:
    """("green" | "red" | "debt", one line per stage and per problem). Red: a unit ran on this tree and failed;
    debt: a unit has not run on this tree (no result, or another key); green: every unit fresh and passed, the
    correctness units all on one computing stack (a benchmark is a record of its own device and stack)."""
    if record.get("schema") != SCHEMA:
        found = record.get("schema")
        return "debt", [f"the record is not a schema-{SCHEMA} record (schema {found!r}): every unit is debt; "
                        "run gpu_check.py --changed on a GPU"]
    lines = []
    all_states = states(record, stages, root)
    for stage in stages:
        mine = [s for s in all_states if s.stage is stage]
        counts = {k: sum(s.status == k for s in mine) for k in ("fresh", "red", "debt")}
        status = "red" if counts["red"] else "debt" if counts["debt"] else "fresh"
        detail = f"{counts['fresh']}/{len(mine)} units fresh" + (f", {counts['red']} red" if counts["red"] else "") \
            + (f", {counts['debt']} debt ({_debt_time([s for s in mine if s.status != 'fresh'])})"
               if counts["debt"] else "")
        lines.append(f"{status:5s} {stage.name:9s} {detail}")
        shown = [s for s in mine if s.status != "fresh"][:6]
        lines += [f"        {s.status} {s.unit}: {s.why}" for s in shown]
        if len([s for s in mine if s.status != "fresh"]) > len(shown):
            lines.append(f"        (+{len([s for s in mine if s.status != 'fresh']) - len(shown)} more)")
    computing = {json.dumps({k: (s.entry or {}).get("environment", {}).get(k) for k in COMPUTE_FIELDS}, sort_keys=True)
                 for s in all_states if s.status == "fresh" and s.entry and not s.stage.per_device}
    problem = len(computing) > 1
    if problem:
        lines.append("problem: fresh results were computed on different stacks: " + "; ".join(sorted(computing)))
    unknown = sorted(set((record.get("stages") or {})) - {s.name for s in stages})
    if unknown:
        lines.append(f"note: the record also has stages this script no longer runs: {', '.join(unknown)}")
    if any(s.status == "red" for s in all_states):
        return "red", lines
    if problem or any(s.status == "debt" for s in all_states):
        return "debt", lines
    return "green", lines


# -- writing entries -----------------------------------------------------------------------------------

def snapshot_of(record: dict[str, Any], paths: Iterable[str], hashes: Hashes, started: str) -> str:
    """Add a snapshot (each path's sha256, 16 digits) of the files a run's units read; its id."""
    table = record.setdefault("paths", [])
    index = {p: i for i, p in enumerate(table)}
    snap: dict[str, str] = {}
    for rel in sorted(set(paths)):
        if rel not in index:
            index[rel] = len(table)
            table.append(rel)
        value = hashes(rel)
        snap[str(index[rel])] = value[:16] if value != "absent" else "absent"
    snapshots = record.setdefault("snapshots", {})
    sid = hashlib.sha256(json.dumps([started, snap], sort_keys=True).encode()).hexdigest()[:12]
    snapshots[sid] = snap
    return sid


def merge_unit(record: dict[str, Any] | None, stage: Stage, unit: str, inputs: Iterable[str], packages: Iterable[str],
               environment: dict[str, Any], result: dict[str, Any], started: str, snapshot: str, hashes: Hashes,
               rerun_reason: str | None = None) -> dict[str, Any]:
    """``record`` with ``unit``'s new result. A result on the same key is replaced only when the run was named
    with a reason, and then the earlier one stays under ``superseded``; a new key starts afresh."""
    record = record if (record or {}).get("schema") == SCHEMA else {"schema": SCHEMA}
    record.update(schema=SCHEMA, key_scheme=KEY_SCHEME)
    inputs = sorted(set(inputs))
    table = record.setdefault("paths", [])
    index = {p: i for i, p in enumerate(table)}
    for rel in inputs:
        if rel not in index:
            index[rel] = len(table)
            table.append(rel)
    env_key = environment_key(environment, stage, packages)
    digest_value = inputs_digest(inputs, hashes)
    key = unit_key(digest_value, env_key, stage.definition())
    stage_entry = record.setdefault("stages", {}).setdefault(stage.name, {})
    units = stage_entry.setdefault("units", {})
    eid = stage.entry_id(unit, environment)
    before = units.get(eid)
    superseded = []
    if before and before.get("key") == key:
        superseded = list(before.get("superseded", [])) + [{"reason": rerun_reason or "(none given)",
                                                             "started": before.get("started"),
                                                             "result": before.get("result")}]
    units[eid] = {"key": key, "inputs_sha256": digest_value, "environment": env_key, "definition": stage.definition(),
                  "provenance": provenance(environment), "started": started, "snapshot": snapshot,
                  "result": result, **({"superseded": superseded} if superseded else {}),
                  "inputs": [index[rel] for rel in inputs]}
    return record


def forget_missing(record: dict[str, Any], stages: list[Stage], root: Path) -> dict[str, Any]:
    """Drop entries of units that no longer exist (a deleted test file) and snapshots nothing refers to."""
    for stage in stages:
        units = ((record.get("stages") or {}).get(stage.name) or {}).get("units") or {}
        alive = set(stage.units(root))
        for eid in list(units):
            unit = eid.rpartition("@")[0] if stage.per_device else eid
            if unit not in alive:
                del units[eid]
    used = {e.get("snapshot") for s in (record.get("stages") or {}).values() for e in (s.get("units") or {}).values()}
    for sid in list(record.get("snapshots") or {}):
        if sid not in used:
            del record["snapshots"][sid]
    return record


def add_run(record: dict[str, Any], stage: Stage, run: dict[str, Any], keep: int = 6) -> None:
    """Keep the stage's last runs (wall time, units, their summed time, workers): the plan's overhead."""
    runs = record.setdefault("stages", {}).setdefault(stage.name, {}).setdefault("runs", [])
    runs.append(run)
    del runs[:-keep]
