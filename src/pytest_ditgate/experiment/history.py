"""A lane's history: append-only JSON lines, each naming the previous record's hash (a hash chain).

The chain's first record (genesis) is pinned in the fixed-paths lock, which ``ditgate baseline`` commits;
its tip is pinned in a git ref (``refs/ditgate/lanes/<lane>``, outside every branch). So deleting,
editing, truncating or relocating the history, or resetting the branch, is seen: the judge then refuses
the experiment (integrity), and never starts a fresh best. The current best is the last KEEP record.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HISTORY_DIR = "lanes"
REF_PREFIX = "refs/ditgate/lanes/"
#: the lane best's commit, pinned: the judge diffs against it and checks it out for its comparator, so git's
#: garbage collection must never drop it, wherever the branch has moved since
BEST_PREFIX = "refs/ditgate/best/"


class HistoryError(RuntimeError):
    """The lane's history is missing, edited, truncated or relocated."""


def record_hash(record: dict[str, Any]) -> str:
    body = {k: v for k, v in record.items() if k != "hash"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def _safe(lane: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", lane)


def history_path(artefacts: Path, lane: str) -> Path:
    return artefacts / HISTORY_DIR / f"{_safe(lane)}.jsonl"


def ref_name(lane: str) -> str:
    return REF_PREFIX + _safe(lane)


def best_ref_name(lane: str) -> str:
    return BEST_PREFIX + _safe(lane)


def pin_best(root: Path, lane: str, commit: str) -> None:
    """Point the lane's best ref at ``commit`` (done before the record that names it is appended: a record's best
    is never unpinned). A commit git no longer has is left unpinned: the scope check already refuses the run
    (12), and that verdict is still recorded."""
    from pytest_ditgate import git

    full = git.rev(root, commit)
    if full is not None and git.rev(root, best_ref_name(lane)) != full:
        git.git(root, "update-ref", best_ref_name(lane), full)


@dataclass
class LaneHistory:
    lane: str
    path: Path
    records: list[dict[str, Any]]

    @property
    def genesis(self) -> dict[str, Any]:
        return self.records[0]

    @property
    def tip(self) -> dict[str, Any]:
        return self.records[-1]

    @property
    def anchor(self) -> str | None:
        """The lane's baseline commit (recorded right after the genesis, once ``ditgate baseline`` committed)."""
        return next((r["anchor"] for r in self.records if r.get("anchor")), None)

    def best(self) -> dict[str, Any]:
        """The last KEEP record's ``best`` (the genesis holds the first)."""
        for record in reversed(self.records):
            if record.get("best"):
                return record["best"]
        raise HistoryError(f"lane {self.lane!r}: no best in its history")


def read_history(root: Path, artefacts: Path, lane: str, *, genesis_hash: str | None) -> LaneHistory:
    """Read and verify the chain: genesis pinned by the lock, tip pinned by the git ref."""
    from pytest_ditgate import git

    path = history_path(artefacts, lane)
    pinned = git.read_blob_ref(root, ref_name(lane))
    if genesis_hash is None:
        raise HistoryError(f"lane {lane!r} has no baseline in the fixed-paths lock; run `ditgate baseline --lane "
                           f"{lane}` first (a maintainer's step)")
    if pinned is None:
        raise HistoryError(f"lane {lane!r}: its history tip ref {ref_name(lane)} is missing")
    try:
        tip = json.loads(pinned)
    except ValueError:
        raise HistoryError(f"lane {lane!r}: ref {ref_name(lane)} is not a history tip") from None
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        main = git.main_worktree(root)
        if main is not None:
            raise HistoryError(f"lane {lane!r}: its history {path} is not in this worktree: this is a linked git "
                               f"worktree, whose {path.parent.parent.name}/ folder is its own, while the lane's "
                               f"refs are shared; run ditgate experiment in the main worktree ({main}), where "
                               "the history is") from None
        raise HistoryError(f"lane {lane!r}: its history {path} is missing (the tip ref names record "
                           f"{tip.get('seq')}); restore it, never start a fresh best") from None
    records = []
    previous = None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            raise HistoryError(f"{path}:{number}: not a JSON record (edited history)") from None
        if not isinstance(record, dict) or record.get("hash") != record_hash(record):
            raise HistoryError(f"{path}:{number}: record hash does not match its content (edited history)")
        if record.get("prev") != previous or record.get("seq") != len(records):
            raise HistoryError(f"{path}:{number}: breaks the chain (records removed, reordered or inserted)")
        records.append(record)
        previous = record["hash"]
    if not records or records[0]["hash"] != genesis_hash:
        raise HistoryError(f"{path}: its first record is not the genesis the lock pins ({genesis_hash[:16]}...)")
    if tip.get("hash") != previous or tip.get("seq") != len(records) - 1:
        raise HistoryError(f"{path}: ends at record {len(records) - 1}, but the tip ref names record "
                           f"{tip.get('seq')} (truncated or replaced history)")
    if tip.get("path") != _relative(root, path):
        raise HistoryError(f"lane {lane!r}: history kept at {tip.get('path')}, now read from {_relative(root, path)} "
                           "(relocated)")
    return LaneHistory(lane, path, records)


def baseline_commits(root: Path, artefacts: Path, lanes: dict[str, Any], lane: str) -> list[tuple[str, str]]:
    """``(lane, commit)`` of every other lane's baseline commit, each read from that lane's history verified as
    the judge verifies its own (the genesis the lock pins, the chain, the tip ref); a lane whose history does
    not hold names none. Such a commit is a maintainer's step that relocks and commits the fixed paths: the
    scope check of ``lane`` takes the changes it made as the maintainer's (``Preflight.check_scope``)."""
    found = []
    for other, entry in sorted(lanes.items()):
        genesis = entry.get("genesis") if isinstance(entry, dict) else None
        if other == lane or not genesis:
            continue
        try:
            anchor = read_history(root, artefacts, other, genesis_hash=genesis).anchor
        except HistoryError:
            continue
        if anchor:
            found.append((other, anchor))
    return found


def _relative(root: Path, path: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(path.resolve())


def seal(lane: str, body: dict[str, Any], previous: dict[str, Any] | None) -> dict[str, Any]:
    """The record that follows ``previous`` (None: the genesis), with its hash."""
    record = dict(body, lane=lane, seq=0 if previous is None else previous["seq"] + 1,
                  prev=None if previous is None else previous["hash"])
    record["hash"] = record_hash(record)
    return record


def ref_lock_problem(root: Path, lane: str) -> str | None:
    """Why the lane's tip ref cannot move now (None when it can): a ``.lock`` file beside it, which a git process
    killed while it moved the ref leaves behind. Checked before a run, so that no verdict is decided that
    cannot be recorded."""
    from pytest_ditgate import git

    lock = git.ref_lock(root, ref_name(lane))
    if not lock.exists():
        return None
    return (f"lane {lane!r}: its tip ref {ref_name(lane)} is locked ({lock} exists): another git process is moving "
            "it, or one was killed while it did; wait for it to end, or, if none runs, remove that file")


def append(root: Path, path: Path, record: dict[str, Any]) -> dict[str, Any]:
    """Append a sealed record and move the tip ref to it, as one change: when the ref cannot move (a stale
    ``.lock`` beside it, a full disk), the file is cut back to its length before the append, so the history and
    its tip never disagree (which would make the lane 12 for every later experiment). :class:`HistoryError`
    says why."""
    import os

    from pytest_ditgate import git
    from pytest_ditgate.fsutil import append_line

    lane = record["lane"]
    path.parent.mkdir(parents=True, exist_ok=True)
    length = path.stat().st_size if path.exists() else 0
    append_line(path, json.dumps(record, sort_keys=True, default=str), fsync=True)
    try:
        git.write_blob_ref(root, ref_name(lane), json.dumps({"lane": lane, "seq": record["seq"], "hash": record["hash"],
                                                            "path": _relative(root, path)}, sort_keys=True))
    except BaseException as exc:
        with open(path, "r+b") as handle:
            handle.truncate(length)
            os.fsync(handle.fileno())
        if isinstance(exc, git.GitError):
            raise HistoryError(f"{ref_lock_problem(root, lane) or exc}; the record was not kept") from None
        raise
    return record
