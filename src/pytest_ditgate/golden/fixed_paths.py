"""The fixed-paths lock: sha256 of every file a candidate must never change, verified at session start.

``[tool.ditgate] fixed_paths`` in pyproject.toml lists files, folders (all files below them) and glob
patterns relative to the rootdir; ``fixed_paths_lock`` names the lock file (default
``golden/fixed_paths.lock.json``). A project can add fixed paths, never remove the defaults
(:data:`DEFAULT_FIXED`): every ``conftest.py``, the pytest ini files, the ``[tool.ditgate]`` and
``[tool.pytest.*]`` tables of pyproject.toml (hashed as tables, so the rest of the file stays editable),
each lane's tests, and the quality contract (``project_paths.py`` says which paths may play which role). (The judge also refuses to run plugin code from inside the project that the lock
does not cover: ``Preflight.check_own_modules`` in ``experiment/preflight.py``.)
Bytecode is locked like any other file, except in ``__pycache__`` folders (the judge never reads those). Under ``--ditgate`` any edited, added or removed file, or a changed
``fixed_paths`` list, stops the session before a test runs, listing what changed. Deliberate runs
(``--ditgate-freeze``, ``--ditgate-refreeze``, ``--ditgate-relock``) rewrite the lock at session end
instead, after any goldens are written, and say so.

A pytest run compares the files with the lock once: :func:`lock_state` holds the run's settings, whether
it is deliberate, and the :class:`LockVerdict` (:meth:`LockState.evaluate`), which the advisory verdict
(``verdict/plugin.py``) reads too. The judge, a process of its own, evaluates the lock itself.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import pytest

from pytest_ditgate import options
from pytest_ditgate.context import get_context
from pytest_ditgate.errors import DitgateUsageError
from pytest_ditgate.golden.options import FREEZE, REFREEZE, RELOCK
from pytest_ditgate.project_paths import DEFAULT_FIXED, DEFAULT_LOCK, contract_entry, lane_files

LOCK_VERSION = 1
_SKIP_PARTS = {"__pycache__", ".pytest_cache", ".git"}
#: the lock's own sibling lock file and atomic-write temporaries; bytecode is NOT skipped (a sourceless
#: ``.pyc`` next to a fixed module would be importable)
_SKIP_SUFFIXES = (".lock", ".tmp")
#: folders never walked when a default pattern searches the whole tree (environments, caches, artefacts)
_PRUNE = {".git", ".venv", "venv", ".tox", ".nox", "node_modules", "__pycache__", ".pytest_cache", ".ditgate",
          ".mypy_cache", ".ruff_cache", "build", "dist"}
TABLE_MARK = "#"
RELOCK_HINT = "if the change is deliberate, run pytest --ditgate --ditgate-relock"


@dataclass(frozen=True)
class LockSettings:
    rootdir: Path
    patterns: tuple[str, ...]
    lock_path: Path
    #: the project asks for a lock (``fixed_paths`` or ``lanes``); a plain ``pytest --ditgate`` run
    #: enforces it only then, the experiment judge always
    configured: bool = True

    @classmethod
    def from_rootdir(cls, rootdir: Path) -> "LockSettings":
        from pytest_ditgate.project_config import load_project_config, string_list

        table = load_project_config(rootdir)
        project = string_list(table, "fixed_paths")
        patterns = tuple(dict.fromkeys([*DEFAULT_FIXED, *lane_files(table), contract_entry(table), *project]))
        lock = table.get("fixed_paths_lock", DEFAULT_LOCK)
        if not isinstance(lock, str):
            raise DitgateUsageError(f"[tool.ditgate] fixed_paths_lock must be a string, got {lock!r}")
        if (rootdir / lock).is_dir():
            raise DitgateUsageError(f"[tool.ditgate] fixed_paths_lock names {lock!r}, a folder: name the lock's JSON "
                                    f"file (default {DEFAULT_LOCK})")
        return cls(rootdir, patterns, rootdir / lock, bool(project or table.get("lanes")))


def _walk(root: Path, pattern: str) -> list[Path]:
    """Files matching a recursive glob, pruning environments and caches."""
    import fnmatch
    import os

    name = pattern.rsplit("/", 1)[-1]
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in _PRUNE and not (Path(folder) / d / "pyvenv.cfg").exists()]
        found += [Path(folder) / f for f in files if fnmatch.fnmatch(f, name)]
    return found


def table_digest(root: Path, spec: str) -> str | None:
    """sha256 of a pyproject table (``pyproject.toml#tool.pytest``) as canonical JSON; None when absent."""
    import json

    from pytest_ditgate.project_config import read_pyproject

    file, _, dotted = spec.partition(TABLE_MARK)
    data: Any = read_pyproject(root / file)
    for part in dotted.split("."):
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def _included(path: Path, lock_path: Path) -> bool:
    return (path.is_file() and path != lock_path and not _SKIP_PARTS & set(path.parts)
            and not path.name.endswith(_SKIP_SUFFIXES))


def expand(settings: LockSettings, known: Mapping[str, str] | None = None) -> dict[str, str]:
    """Relative posix path -> sha256 for every file the patterns name (sorted). ``known``: digests of an
    :func:`expand` of the same moment, not computed again."""
    root = settings.rootdir
    files: set[Path] = set()
    tables: dict[str, str] = {}
    for pattern in settings.patterns:
        target = root / pattern
        if TABLE_MARK in pattern:
            digest = table_digest(root, pattern)
            if digest is not None:
                tables[pattern] = digest
            continue
        if pattern.startswith("**/"):
            found = _walk(root, pattern)
        elif any(ch in pattern for ch in "*?["):
            found = root.glob(pattern)
        elif target.is_dir():
            found = target.rglob("*")
        else:
            found = [target]
        files.update(p for p in found if _included(p, settings.lock_path))
    known = known or {}
    hashed = {}
    for path in sorted(files):
        relative = path.relative_to(root).as_posix()
        hashed[relative] = known.get(relative) or hashlib.sha256(path.read_bytes()).hexdigest()
    return dict(sorted({**hashed, **tables}.items()))


@dataclass(frozen=True)
class LockVerdict:
    """Differences between the files now and the lock; empty lists mean the fixed paths are intact."""

    lock_path: Path
    missing_lock: bool = False
    edited: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    patterns_before: tuple[str, ...] | None = None
    patterns_now: tuple[str, ...] = ()
    unreadable: str | None = None

    @property
    def changed(self) -> bool:
        return bool(self.missing_lock or self.unreadable or self.edited or self.added or self.removed
                    or (self.patterns_before is not None and self.patterns_before != self.patterns_now))

    def lines(self) -> list[str]:
        if self.missing_lock:
            return [f"no fixed-paths lock at {self.lock_path}; run pytest --ditgate --ditgate-relock to create it"]
        if self.unreadable:
            return [f"fixed-paths lock {self.lock_path} is unreadable ({self.unreadable})"]
        out = []
        if self.patterns_before is not None and self.patterns_before != self.patterns_now:
            out.append(f"fixed_paths setting changed: lock has {list(self.patterns_before)}, "
                       f"pyproject has {list(self.patterns_now)}")
        out += [f"edited:  {p}" for p in self.edited]
        out += [f"added:   {p}" for p in self.added]
        out += [f"removed: {p}" for p in self.removed]
        return out


class LockUnreadable(ValueError):
    """The lock file exists but is not a fixed-paths lock: ``detail`` says why (the bad field), the message names
    the file too."""

    def __init__(self, path: Path, detail: str) -> None:
        super().__init__(f"{path}: {detail}")
        self.path = path
        self.detail = detail


def parse_lock(path: Path) -> dict[str, Any] | None:
    """The lock at ``path``, checked field by field (None when there is no file): the one place a lock is read.
    A lock is a JSON object with ``files`` (path -> sha256), and optionally ``version`` (an integer),
    ``patterns`` (a list of strings) and ``lanes`` (lane name -> ``{"genesis": "<commit>"}``); anything else
    (a hand edit, another file the setting names) raises :class:`LockUnreadable` naming ``path`` and the field."""
    from pytest_ditgate.fsutil import loads_json

    try:
        data = loads_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # not JSON, not UTF-8, a key twice, a folder
        raise LockUnreadable(path, str(exc)) from None
    problem = _lock_problem(data)
    if problem:
        raise LockUnreadable(path, f"not a fixed-paths lock: {problem}")
    return data


def _lock_problem(data: Any) -> str | None:
    """Why ``data`` is not a lock's content (None when it is)."""
    if not isinstance(data, dict):
        return f"the file holds {type(data).__name__}, not a JSON object"
    files = data.get("files")
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        return f"'files' must be a table of path -> sha256, got {_short(files)}"
    if "version" in data and (not isinstance(data["version"], int) or isinstance(data["version"], bool)):
        return f"'version' must be an integer, got {_short(data['version'])}"
    patterns = data.get("patterns", [])
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        return f"'patterns' must be a list of strings, got {_short(patterns)}"
    lanes = data.get("lanes", {})
    if not isinstance(lanes, dict):
        return f"'lanes' must be a table of lane name -> {{\"genesis\": commit}}, got {_short(lanes)}"
    for name, lane in lanes.items():
        if not isinstance(lane, dict) or not isinstance(lane.get("genesis", ""), str):
            return f"'lanes.{name}' must be a table {{\"genesis\": \"<commit>\"}}, got {_short(lane)}"
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def evaluate_lock(settings: LockSettings, now: dict[str, str] | None = None) -> LockVerdict:
    """Compare the files on disk with the lock (pure decision; nothing is written). ``now`` is
    :func:`expand` of ``settings`` when the caller already hashed the files."""
    try:
        data = parse_lock(settings.lock_path)
    except LockUnreadable as exc:
        return LockVerdict(settings.lock_path, unreadable=exc.detail)
    if data is None:
        return LockVerdict(settings.lock_path, missing_lock=True)
    locked: dict[str, str] = data["files"]
    now = expand(settings) if now is None else now
    return LockVerdict(
        settings.lock_path,
        edited=tuple(sorted(p for p in now.keys() & locked.keys() if now[p] != locked[p])),
        added=tuple(sorted(now.keys() - locked.keys())),
        removed=tuple(sorted(locked.keys() - now.keys())),
        patterns_before=tuple(data.get("patterns", ())),
        patterns_now=settings.patterns,
    )


def read_lock(settings: LockSettings) -> dict[str, Any]:
    """The lock file's data (empty when missing or unreadable: :func:`evaluate_lock` reports those)."""
    try:
        return parse_lock(settings.lock_path) or {}
    except LockUnreadable:
        return {}


def overwrite_problem(settings: LockSettings) -> str | None:
    """Why the lock file may not be rewritten (None when it may): it exists and is not a lock. ditgate never
    overwrites a file it could not read as its own lock (the setting may name another file)."""
    try:
        parse_lock(settings.lock_path)
    except LockUnreadable as exc:
        return (f"refusing to overwrite {exc.path}, which cannot be read as a fixed-paths lock ({exc.detail}): if "
                "it is a broken lock, move it away and relock; else name a file of its own in [tool.ditgate] "
                f"fixed_paths_lock (default {DEFAULT_LOCK})")
    return None


def write_lock(settings: LockSettings, *, lanes: dict[str, Any] | None = None) -> int:
    """Rewrite the lock atomically from the files as they are now; returns the number of files.

    The lanes' genesis hashes recorded by ``ditgate baseline`` are kept (``lanes`` adds or replaces some). A file
    at the lock's path that is not a lock is never overwritten: DitgateUsageError (:func:`overwrite_problem`).
    """
    from pytest_ditgate.fsutil import atomic_write_json, lock_for

    files = expand(settings)
    with lock_for(settings.lock_path):
        problem = overwrite_problem(settings)
        if problem:
            raise DitgateUsageError(problem)
        kept = dict(read_lock(settings).get("lanes") or {})
        kept.update(lanes or {})
        data: dict[str, Any] = {"version": LOCK_VERSION, "patterns": list(settings.patterns), "files": files}
        if kept:
            data["lanes"] = kept
        atomic_write_json(settings.lock_path, data)
    return len(files)


@dataclass
class LockState:
    """The run's lock: its settings, whether the run rewrites it (and why), and the comparison, made once."""

    settings: LockSettings
    deliberate: str | None  # "freeze", "refreeze", "relock" or None
    #: this run verifies (and a deliberate run rewrites) the lock: the project asks for one, or --ditgate-relock
    enforced: bool = True
    verdict: LockVerdict | None = None
    summary: list[str] = field(default_factory=list)

    def evaluate(self) -> LockVerdict:
        """The files compared with the lock, on the first call of the run (every later caller gets that one)."""
        if self.verdict is None:
            self.verdict = evaluate_lock(self.settings)
        return self.verdict


_state_key = pytest.StashKey[LockState]()


def lock_state(config: pytest.Config) -> LockState | None:
    """The run's lock state (None in an xdist worker: the controller verifies the lock)."""
    return config.stash.get(_state_key, None)


def _deliberate(config: pytest.Config) -> str | None:
    for name, spec in (("relock", RELOCK), ("refreeze", REFREEZE), ("freeze", FREEZE)):
        if options.get_option(config, spec):
            return name
    return None


def pytest_configure(config: pytest.Config) -> None:
    """Registered only under ``--ditgate`` (``plugin.py`` refuses ``--ditgate-relock`` without it)."""
    if get_context(config).is_xdist_worker:
        return
    try:
        settings = LockSettings.from_rootdir(Path(config.rootpath))
    except DitgateUsageError as exc:
        raise pytest.UsageError(str(exc)) from None
    problems = missing_fixed_paths(config)
    if problems:
        raise pytest.UsageError(problems[0])
    enforced = settings.configured or bool(options.get_option(config, RELOCK))
    deliberate = _deliberate(config)
    problem = overwrite_problem(settings) if enforced and deliberate else None
    if problem:
        raise pytest.UsageError(f"--ditgate-{deliberate}: {problem}")
    config.stash[_state_key] = LockState(settings, deliberate, enforced)


def missing_fixed_paths(config: pytest.Config) -> list[str]:
    """:func:`unlocated_fixed_paths` of this run's settings and golden store."""
    from pytest_ditgate.golden.golden_plugin import golden_dir, golden_mode

    root = Path(config.rootpath)
    return unlocated_fixed_paths(LockSettings.from_rootdir(root), golden_dir(config, golden_mode(config)))


def unlocated_fixed_paths(settings: LockSettings, store: Path) -> list[str]:
    """A problem for each ``[tool.ditgate] fixed_paths`` entry that names nothing (a typo locks nothing), except
    the golden store, which the first ``--ditgate-freeze`` creates, and an entry the lock holds files of: those
    were removed, and the lock's own comparison says which."""
    import fnmatch

    from pytest_ditgate.project_config import load_project_config, missing_paths, string_list

    root = settings.rootdir
    locked = list(read_lock(settings).get("files") or {})

    def recorded(entry: str) -> bool:
        if any(ch in entry for ch in "*?["):
            return any(fnmatch.fnmatch(path, entry) for path in locked)
        folder = entry.rstrip("/")
        return any(path == folder or path.startswith(folder + "/") for path in locked)

    entries = [entry for entry in string_list(load_project_config(root), "fixed_paths")
               if not (root / entry).resolve().is_relative_to(store.resolve()) and not recorded(entry)]
    return missing_paths(root, entries, "[tool.ditgate] fixed_paths")


def _enforced(config: pytest.Config) -> LockState | None:
    state = lock_state(config)
    return state if state is not None and state.enforced else None


def pytest_sessionstart(session: pytest.Session) -> None:
    """Verify the lock before any test runs; a change stops the session unless the run is deliberate."""
    state = _enforced(session.config)
    if state is None:
        return
    if not state.evaluate().changed:
        return
    if state.deliberate:
        state.summary.append(f"fixed paths changed before this --ditgate-{state.deliberate} run:")
        state.summary += ["  " + line for line in state.verdict.lines()]
        return
    verdict = state.verdict
    if verdict.missing_lock or verdict.unreadable:
        message = "ditgate: cannot verify the fixed paths: " + verdict.lines()[0]
    else:
        message = "\n  ".join([f"ditgate: fixed paths changed (lock {state.settings.lock_path}):",
                               *verdict.lines(), RELOCK_HINT])
    pytest.exit(message, returncode=pytest.ExitCode.TESTS_FAILED)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Deliberate runs rewrite the lock last (after golden writes in earlier sessionfinish hooks)."""
    state = _enforced(session.config)
    if state is None or not state.deliberate:
        return
    if session.exitstatus == pytest.ExitCode.USAGE_ERROR:  # stopped before any test: a usage error writes nothing
        state.summary.append(f"fixed-paths lock {state.settings.lock_path} NOT rewritten: the run stopped at a "
                             "usage error")
        return
    try:
        count = write_lock(state.settings)
    except (OSError, DitgateUsageError) as exc:
        state.summary.append(f"could not rewrite the fixed-paths lock {state.settings.lock_path}: {exc}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        return
    state.summary.append(f"RELOCKED: fixed-paths lock {state.settings.lock_path} rewritten "
                         f"({count} files, --ditgate-{state.deliberate})")


@pytest.hookimpl(trylast=True)  # after other plugins' sections: ditgate's summary is read last
def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    state = _enforced(config)
    if state is None or not state.summary:
        return
    terminalreporter.section("ditgate fixed paths", sep="-")
    for line in state.summary:
        terminalreporter.write_line(line, yellow=True, bold=line.startswith("RELOCKED"))
