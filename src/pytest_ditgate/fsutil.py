"""Crash-safe file writes: atomic replace for whole files, locked single-write appends for ledgers.

A run interrupted at any point leaves either the old file or the new one, never half of either, and
concurrent pytest-xdist workers never tear each other's lines.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder and an atomic rename."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return target


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def lock_for(path: str | os.PathLike[str]):
    """A cross-process lock guarding ``path`` (a sibling ``.lock`` file)."""
    from filelock import FileLock

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(target) + ".lock", thread_local=False)


def append_line(path: str | os.PathLike[str], line: str, *, fsync: bool = False) -> None:
    """Append one line under a file lock with a single ``write`` call, so no reader sees half a line."""
    if "\n" in line:
        raise ValueError("a ledger line must not contain a newline")
    data = (line + "\n").encode("utf-8")
    with lock_for(path):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)


def append_jsonl(path: str | os.PathLike[str], record: dict[str, Any], *, fsync: bool = False) -> None:
    append_line(path, json.dumps(record, sort_keys=True, default=str, allow_nan=True), fsync=fsync)


def read_jsonl(path: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], list[int]]:
    """All records of a JSONL file and the 1-based numbers of lines that did not parse (never raises on them)."""
    records: list[dict[str, Any]] = []
    bad: list[int] = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return records, bad
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            bad.append(number)
            continue
        if isinstance(value, dict):
            records.append(value)
        else:
            bad.append(number)
    return records, bad
