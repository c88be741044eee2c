"""Crash-safe file writes: atomic replace for whole files, locked single-write appends for ledgers.

A run interrupted at any point leaves either the old file or the new one, never half of either, and
concurrent pytest-xdist workers never tear each other's lines.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import warnings
from dataclasses import dataclass, field
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


def append_line(path: str | os.PathLike[str], line: str, *, fsync: bool = False, header: str | None = None) -> None:
    """Append one line under a file lock with a single ``write`` call, so no reader sees half a line.

    Newline-safe: when the file does not end in a newline (a writer was killed mid-line), the torn tail
    is closed first, so the new record starts on its own line and only the torn one is lost (readers
    report it), never the new one glued onto it. ``header``: a first line, written (in the same ``write``)
    only when the file is empty, as a table's column names.
    """
    if any("\n" in text or "\r" in text for text in (line, header or "")):
        raise ValueError("a ledger line must not contain a newline")
    data = (line + "\n").encode("utf-8")
    with lock_for(path):
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if header is not None and not size:
                data = (header + "\n").encode("utf-8") + data
            if size and os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data
            view = memoryview(data)
            while view:  # a short write (full disk, signal) must not leave the rest unwritten silently
                written = os.write(fd, view)
                view = view[written:]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)


def append_jsonl(path: str | os.PathLike[str], record: dict[str, Any], *, fsync: bool = False) -> None:
    append_line(path, json.dumps(record, sort_keys=True, default=str, allow_nan=True), fsync=fsync)


class LedgerWarning(UserWarning):
    """A ledger or record file had lines or content that had to be skipped (the message says which)."""


@dataclass(frozen=True)
class JsonlContent:
    """What :func:`read_jsonl_report` found: the records, and the 1-based line numbers it skipped."""

    path: Path
    records: list[dict[str, Any]]
    bad: list[int]
    #: the 1-based line number of each record (same order), to name records of the wrong shape
    line_numbers: list[int] = field(default_factory=list)

    def skipped_message(self) -> str | None:
        """``<path>: skipped 2 unreadable line(s) (3, 7)``, or None when every line was read."""
        return skipped_message(self.path, self.bad, "line", "not a JSON object")


def line_list(numbers: list[int]) -> str:
    """``line 3`` / ``lines 3, 7, 9, ...`` (the first ten) for a message naming records."""
    if not numbers:
        return "line ?"
    shown = ", ".join(str(n) for n in numbers[:10]) + (", ..." if len(numbers) > 10 else "")
    return f"line {shown}" if len(numbers) == 1 else f"lines {shown}"


def skipped_message(path: str | os.PathLike[str], bad: list[int], unit: str, why: str) -> str | None:
    """``<path>: skipped 2 unreadable <unit>(s) (3, 7): <why> (...)`` for a ledger's skipped lines or rows
    (the first ten numbers shown), or None when none was skipped."""
    if not bad:
        return None
    shown = ", ".join(str(n) for n in bad[:10]) + (", ..." if len(bad) > 10 else "")
    return f"{path}: skipped {len(bad)} unreadable {unit}(s) ({shown}): {why} (a torn write or a hand edit)"


def read_jsonl_report(path: str | os.PathLike[str]) -> JsonlContent:
    """Every JSON-object line of ``path`` and the numbers of the lines skipped (bad JSON, not an object,
    not UTF-8). A missing file is empty. Never raises on content."""
    file = Path(path)
    records: list[dict[str, Any]] = []
    bad: list[int] = []
    numbers: list[int] = []
    try:
        raw = file.read_bytes()
    except FileNotFoundError:
        return JsonlContent(file, records, bad, numbers)
    for number, chunk in enumerate(raw.split(b"\n"), start=1):
        if not chunk.strip():
            continue
        try:
            value = json.loads(chunk.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            bad.append(number)
            continue
        if isinstance(value, dict):
            records.append(value)
            numbers.append(number)
        else:
            bad.append(number)
    return JsonlContent(file, records, bad, numbers)


def read_jsonl(path: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], list[int]]:
    """All records of a JSONL file and the 1-based numbers of lines that did not parse (never raises on them)."""
    content = read_jsonl_report(path)
    return content.records, content.bad


def read_jsonl_warn(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of ``path``; skipped lines are reported as a :class:`LedgerWarning` naming them."""
    content = read_jsonl_report(path)
    message = content.skipped_message()
    if message:
        warnings.warn(LedgerWarning(message), stacklevel=2)
    return content.records


class DuplicateKey(ValueError):
    """A JSON object names one key twice (a hand edit, a merge): ``json.loads`` would keep the last silently."""


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise DuplicateKey(f"the key {key!r} appears twice in one object (a hand edit or a merge?): keep one")
        seen[key] = value
    return seen


def loads_json(text: str) -> Any:
    """``json.loads`` of a record ditgate wrote, refusing an object that names a key twice (:class:`DuplicateKey`):
    which of two manifest entries or lock hashes counts must never be decided silently."""
    return json.loads(text, object_pairs_hook=_unique_pairs)


class CorruptFile(ValueError):
    """A record file that exists but cannot be read as what it should be (the message names it)."""


def decode_json_object(data: bytes, where: str) -> dict[str, Any]:
    """``data`` as a JSON object; :class:`CorruptFile` starting with ``where`` when it is not UTF-8, not
    JSON, or not an object."""
    try:
        value = loads_json(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise CorruptFile(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except ValueError as exc:
        raise CorruptFile(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise CorruptFile(f"{where}: must hold a JSON object, found {type(value).__name__}")
    return value


def read_json_object(path: str | os.PathLike[str], *, what: str = "record") -> dict[str, Any] | None:
    """The JSON object in ``path``; None when the file is absent; :class:`CorruptFile` (naming the file
    and the problem) when it is not UTF-8, not JSON, or not an object. Callers check the fields they need."""
    file = Path(path)
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        return None
    return decode_json_object(data, f"{what} {file}")


def remove_stale_temps(folder: str | os.PathLike[str], *, older_than_s: float = 0.0, recursive: bool = True) -> list[Path]:
    """Remove temporary files left by killed :func:`atomic_write_bytes` calls (``.<name>.*.tmp``).

    Call it while holding the lock that guards writes into ``folder`` (then ``older_than_s=0`` is safe:
    no write can be in flight); returns what was removed.
    """
    root = Path(folder)
    if not root.is_dir():
        return []
    now = time.time()
    removed = []
    for tmp in (root.rglob(".*.tmp") if recursive else root.glob(".*.tmp")):
        try:
            if tmp.is_file() and now - tmp.stat().st_mtime >= older_than_s:
                tmp.unlink()
                removed.append(tmp)
        except OSError:
            continue
    return removed


GITIGNORE_TEXT = "# created by pytest-ditgate: run artefacts (ledgers, locks, images) stay out of version control\n*\n"


def ensure_gitignore(folder: str | os.PathLike[str]) -> None:
    """Put a ``.gitignore`` ignoring everything into a generated folder (like ``.pytest_cache``), once."""
    target = Path(folder) / ".gitignore"
    if target.exists():
        return
    try:
        atomic_write_text(target, GITIGNORE_TEXT)
    except OSError:
        pass  # a read-only folder: the hint is a courtesy, never a failure
