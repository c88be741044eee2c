"""The freeze journal: a flush of queued goldens that is interrupted at any point leaves a store that every
later run reads as whole.

A flush writes golden files, then the manifest that lists them: two steps, and a run killed between them
(Ctrl-C at the end of a long freeze, a CI timeout) used to leave files the manifest does not list, or no
manifest at all, and the next freeze then failed them as ``golden_untracked``. So before it writes a file, a
flush records the entries it is about to add in ``<golden dir>/.freeze-journal.json`` (atomically), and
removes the journal once the manifest is saved. Whatever is on disk after an interruption:

* a journaled entry whose file is on disk with the journaled sha256 was written whole (files are renamed
  into place), and counts as listed: :func:`with_completed` merges it into the manifest as read, in memory,
  for every reader (a check never writes);
* a journaled entry whose file is missing or different was never written: it does not count, and the next
  freeze queues that golden again;
* the next flush (under the manifest lock) saves the merged manifest and removes the journal
  (:func:`settle`): the interrupted freeze is completed for what it wrote.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pytest_ditgate.fsutil import loads_json
from pytest_ditgate.golden.manifest import GoldenEntry, Manifest, ManifestError

JOURNAL_NAME = ".freeze-journal.json"
#: what to do with a journal that cannot be read (it is only ever written whole: someone edited it)
REMEDY = "remove it, then freeze again"


def journal_path(root: Path) -> Path:
    return Path(root) / JOURNAL_NAME


def begin(root: Path, entries: list[GoldenEntry]) -> None:
    """Record the entries a flush is about to write (call under the manifest lock, before any file)."""
    from dataclasses import asdict

    from pytest_ditgate.fsutil import atomic_write_json

    atomic_write_json(journal_path(root), {"version": 1, "entries": [asdict(entry) for entry in entries]})


def end(root: Path) -> None:
    """The flush is complete (its manifest saved): forget the journal."""
    journal_path(root).unlink(missing_ok=True)


def journaled(root: Path) -> list[GoldenEntry]:
    """The entries of an interrupted flush (empty when there is none). A journal that cannot be read, or holds
    a malformed entry, is a ManifestError naming it and saying what to do: it is only ever written whole, so
    someone edited it."""
    path = journal_path(root)
    try:
        data = loads_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{path}: the freeze journal cannot be read ({exc}); {REMEDY}") from None
    raw = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(raw, list):
        raise ManifestError(f"{path}: the freeze journal must hold a list of entries; {REMEDY}")
    try:
        return [GoldenEntry.from_dict(item, f"{path} entry {index}") for index, item in enumerate(raw)]
    except ManifestError as exc:
        raise ManifestError(f"{exc}; {REMEDY}") from None


def with_completed(store: Any, manifest: Manifest) -> Manifest:
    """``manifest`` with every journaled entry whose file was written whole (the file on disk has the
    journaled sha256 and size), in memory. ``store``: the ``GoldenStore`` (its ``root`` and ``inside``)."""
    import hashlib

    for entry in journaled(store.root):
        current = manifest.entries.get(entry.id)
        if current is not None and current.sha256 == entry.sha256:
            continue
        path = store.root / entry.file
        try:
            data = path.read_bytes() if path.is_file() and store.inside(path) else None
        except OSError:
            data = None
        if data is not None and len(data) == entry.size and hashlib.sha256(data).hexdigest() == entry.sha256:
            manifest.put(entry)
    return manifest


def settle(store: Any) -> Manifest:
    """Under the manifest lock: complete an interrupted flush (save the manifest with what it wrote, then drop
    the journal); the manifest as it now is."""
    manifest = store.load_manifest()
    if journal_path(store.root).exists():
        manifest.save()
        end(store.root)
    return manifest
