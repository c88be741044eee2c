"""The GPU check's record, stage by stage: what each stage's result depends on, and whether it still holds.

A stage declares its inputs as globs relative to the repository root (``dir/**`` is every file under
``dir``; anything else is a :meth:`pathlib.Path.glob` pattern). Its **files digest** is the sha256 over each
input file's relative path and bytes in sorted order, the scheme of ``gpu_check.py --hash``; its **key** is
the sha256 of the canonical JSON of ``{"files": digest, "environment": ..., "stage": spec}``, where the spec
is what the stage runs and how its result is judged. A recorded result holds for a tree while the key
recomputed from that tree, with the recorded environment, equals the recorded key.

Standard library only: ``gpu_check.py --verify`` runs on any machine, without torch.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

#: the record format this module reads and writes
SCHEMA = 2
#: how a key is made, written into every record so that anyone can recompute one
KEY_SCHEME = ("key = sha256 of the canonical JSON (sorted keys, no spaces) of {\"files\": files_sha256, "
              "\"environment\": the stage's environment, \"stage\": {\"inputs\": inputs, \"runs\": runs, "
              "\"judged_by\": judged_by}}; files_sha256 = sha256 over each input file's relative path and "
              "bytes in sorted order, as gpu_check.py --hash; 'dir/**' is every file under dir")
#: the paths whose changes need a GPU record before they land (gpu_check.py --hash covers these)
HASHED_DIRS = ("src", "kernels", "dit_impl", "tests", "golden", "fixtures")
HASHED_FILES = ("conftest.py", "pyproject.toml")
#: inputs of every stage: the plugin and the project's configuration
COMMON_INPUTS = ("src/**", "conftest.py", "pyproject.toml")
SKIPPED_DIRS = {"__pycache__", ".ditgate", ".pytest_cache", ".hypothesis", "build", "dist", ".tox"}
SKIPPED_SUFFIXES = (".pyc", ".pyo", ".egg-info", ".lock")  # .lock: filelock's lock files beside what they guard


@dataclass(frozen=True)
class Stage:
    """One stage of the check: what it reads (``inputs``, besides :data:`COMMON_INPUTS`), what it runs
    (``runs``, as it is recorded), how long it may take and, for stages judged by targets, the source of the
    rule that judges them (``judged_by``), so that a changed rule makes the stage stale too."""

    name: str
    inputs: tuple[str, ...]
    runs: str
    limit_s: int
    judged_by: str = ""

    def all_inputs(self) -> list[str]:
        return list(COMMON_INPUTS) + [glob for glob in self.inputs if glob not in COMMON_INPUTS]

    def spec(self) -> dict[str, Any]:
        judged = hashlib.sha256(self.judged_by.encode()).hexdigest()[:16] if self.judged_by else None
        return {"inputs": self.all_inputs(), "runs": self.runs, "judged_by": judged}


# -- files and digests ---------------------------------------------------------------------------------

def _walk(folder: Path) -> Iterable[Path]:
    for parent, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not d.endswith(SKIPPED_SUFFIXES))
        yield from (Path(parent) / n for n in names if not n.endswith(SKIPPED_SUFFIXES))


def expand(globs: Iterable[str], root: Path) -> list[Path]:
    """The files ``globs`` name under ``root`` (caches and lock files left out), sorted by relative path."""
    found: set[Path] = set()
    for glob in globs:
        if glob.endswith("/**"):
            found.update(_walk(root / glob[:-3]))
        else:
            found.update(p for p in root.glob(glob) if p.is_file() and not p.name.endswith(SKIPPED_SUFFIXES)
                         and not SKIPPED_DIRS.intersection(p.relative_to(root).parts))
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def hashed_files(root: Path) -> list[Path]:
    """Every file whose change needs a GPU record (the tree hash's files)."""
    return expand([f"{d}/**" for d in HASHED_DIRS] + list(HASHED_FILES), root)


def digest(files: Iterable[Path], root: Path) -> str:
    """sha256 over each file's relative path and bytes, in the given (sorted) order."""
    sha = hashlib.sha256()
    for path in files:
        rel = path.relative_to(root).as_posix().encode()
        data = path.read_bytes()
        sha.update(b"%d:%s\0%d:" % (len(rel), rel, len(data)))
        sha.update(data)
    return sha.hexdigest()


def file_hashes(files: Iterable[Path], root: Path) -> dict[str, str]:
    """Each file's sha256 (first 16 hex digits), by relative path: enough to name what changed."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()[:16] for p in files}


def stage_key(files_sha256: str, environment: dict[str, Any], stage: Stage) -> str:
    payload = {"files": files_sha256, "environment": environment, "stage": stage.spec()}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class StageState:
    """A stage's inputs as they are in a tree: the files, their digest and their hashes."""

    files_sha256: str
    files: dict[str, str]

    def key(self, environment: dict[str, Any], stage: Stage) -> str:
        return stage_key(self.files_sha256, environment, stage)


def state_of(stage: Stage, root: Path) -> StageState:
    files = expand(stage.all_inputs(), root)
    return StageState(digest(files, root), file_hashes(files, root))


def uncovered(stages: Iterable[Stage], root: Path) -> list[str]:
    """The hashed files of a tree that no stage reads (each would change without making a result stale).
    Every stage reads the plugin and the project's configuration by construction (:meth:`Stage.all_inputs`)."""
    read = set()
    for stage in stages:
        read.update(expand(stage.all_inputs(), root))
    return [f"{p.relative_to(root).as_posix()} is an input of no stage" for p in hashed_files(root) if p not in read]


# -- judging a record against a tree -------------------------------------------------------------------

def changed_files(recorded: dict[str, str], now: dict[str, str], most: int = 6) -> str:
    """'edited a, b; added c; removed d' between two file-hash maps (at most ``most`` names in all)."""
    edited = [p for p in now if p in recorded and recorded[p] != now[p]]
    added = [p for p in now if p not in recorded]
    removed = [p for p in recorded if p not in now]
    parts, left = [], most
    for word, paths in (("edited", edited), ("added", added), ("removed", removed)):
        if paths:
            shown = paths[:max(left, 1)]
            left -= len(shown)
            parts.append(f"{word} {', '.join(shown)}" + (f" (+{len(paths) - len(shown)} more)" if len(paths) > len(shown) else ""))
    return "; ".join(parts) or "the stage's definition changed"


def stage_status(entry: dict[str, Any] | None, stage: Stage, state: StageState,
                 environment: dict[str, Any] | None = None) -> tuple[str, str]:
    """("fresh" | "stale" | "red", why) for a recorded stage entry against the tree's ``state``. The key is
    recomputed with ``environment`` (the machine's, when running) or else the environment recorded."""
    if not entry or "key" not in entry:
        return "stale", "no result recorded"
    env = entry.get("environment") if environment is None else environment
    if env != entry.get("environment"):
        diffs = sorted(k for k in set(env or {}) | set(entry.get("environment") or {})
                       if (env or {}).get(k) != (entry.get("environment") or {}).get(k))
        return "stale", f"environment differs ({', '.join(diffs)})"
    if state.key(env, stage) != entry["key"]:
        if state.files_sha256 != entry.get("files_sha256"):
            return "stale", changed_files(entry.get("files", {}), state.files)
        return "stale", "the stage's definition changed (inputs, what it runs or the rule that judges it)"
    result = entry.get("result") or {}
    if not result.get("passed"):
        failures = result.get("failures") or ["not passed"]
        return "red", f"{failures[0]}" + (f" (+{len(failures) - 1} more)" if len(failures) > 1 else "")
    return "fresh", ""


def verify(record: dict[str, Any], stages: list[Stage], root: Path) -> tuple[bool, list[str]]:
    """Whether ``record`` covers the tree at ``root``: every stage's key recomputed from the tree equals the
    recorded one and that stage passed, all on one environment, and every hashed file is some stage's input.
    Returns (ok, one line per stage and per problem)."""
    lines, ok = [], True
    if record.get("schema") != SCHEMA:
        return False, [f"the record is not a staged record (schema {record.get('schema')!r}, want {SCHEMA}): "
                       "run gpu_check.py --changed on a GPU"]
    entries = record.get("stages", {})
    for stage in stages:
        status, why = stage_status(entries.get(stage.name), stage, state_of(stage, root))
        ok &= status == "fresh"
        seconds = (entries.get(stage.name) or {}).get("result", {}).get("seconds")
        lines.append(f"{status:5s} {stage.name:9s}" + (f" {seconds:6.0f} s" if seconds is not None else " " * 8)
                     + (f"  {why}" if why else ""))
    environments = {json.dumps(e.get("environment"), sort_keys=True) for e in entries.values() if e.get("environment")}
    if len(environments) > 1:
        ok = False
        lines.append("problem: the stages ran on different environments: "
                     + "; ".join(f"{name}: {summary(e.get('environment'))}" for name, e in entries.items()))
    unknown = sorted(set(entries) - {s.name for s in stages})
    if unknown:
        lines.append(f"note: the record also has stages this script no longer runs: {', '.join(unknown)}")
    problems = uncovered(stages, root)
    ok &= not problems
    lines += [f"problem: {p}" for p in problems[:10]] + ([f"problem: (+{len(problems) - 10} more)"] if len(problems) > 10 else [])
    return ok, lines


def summary(environment: dict[str, Any] | None) -> str:
    env = environment or {}
    return f"{env.get('device')} {env.get('arch')}, torch {env.get('torch')}, driver {env.get('driver')}"


def merge(record: dict[str, Any] | None, stage: Stage, state: StageState, environment: dict[str, Any],
          result: dict[str, Any], started: str, rerun_reason: str | None = None) -> dict[str, Any]:
    """``record`` with ``stage``'s new result. A result for the same key is replaced only when the run was
    named with a reason, and then the earlier one stays under ``superseded``; a new key starts afresh."""
    record = dict(record or {}) if (record or {}).get("schema") == SCHEMA else {}
    stages = dict(record.get("stages", {}))
    key = state.key(environment, stage)
    before = stages.get(stage.name)
    superseded = []
    if before and before.get("key") == key:
        superseded = list(before.get("superseded", [])) + [{"reason": rerun_reason or "(none given)",
                                                             "started": before.get("started"),
                                                             "result": before.get("result")}]
    stages[stage.name] = {"key": key, "files_sha256": state.files_sha256, "environment": environment,
                          "inputs": stage.all_inputs(), "runs": stage.runs, "judged_by": stage.spec()["judged_by"],
                          "started": started, "result": result,
                          **({"superseded": superseded} if superseded else {}), "files": state.files}
    record.update(schema=SCHEMA, key_scheme=KEY_SCHEME, stages=stages)
    return record
