"""``ditgate baseline`` as one transaction: it commits in full, or leaves the tree as it was.

A baseline writes into the project (goldens, the golden manifest, the fixed-paths lock), stages everything,
commits, and starts the lane's history (a file under the artefact folder and a git ref). A failure anywhere
(a red run, a commit git refuses, a full disk, Ctrl-C) must not leave half of that behind: a lock that names
a lane with no baseline commit refuses every later baseline, and goldens left uncommitted are committed by
the next baseline as orphans. :class:`TreeSnapshot` records, before anything is written, what the baseline
can change, and :meth:`TreeSnapshot.restore` puts it back:

* the branch head and the index (``git write-tree``), so a commit and a ``git add -A`` are undone;
* the bytes of the files the baseline rewrites (the lock, the golden manifest), or their absence;
* which files and folders existed in the golden store, so that every golden file the run created is removed
  (files that were there before are never touched);
* the lane's history file and its tip ref, removed when the baseline made them.

Untracked files the run created elsewhere (a lane test's scratch output) are not deleted, since something
else may have made them meanwhile: :meth:`TreeSnapshot.restore` names them instead.

Records that belong together (an experiment's history record and its tip ref) are written in an
:func:`uninterrupted` block.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator


@dataclass
class TreeSnapshot:
    root: Path
    head: str | None
    index_tree: str
    #: relative path -> content before the baseline (None: the file did not exist)
    saved: dict[str, bytes | None]
    #: the golden store's files and folders before (relative paths)
    store_files: set[str]
    store_dirs: set[str]
    store: Path
    untracked: set[str]
    #: what the baseline itself may create outside the tree (history file, tip ref), removed on restore
    history: Path | None = None
    ref: str | None = None
    notes: list[str] = field(default_factory=list)

    @classmethod
    def take(cls, root: Path, *, rewritten: list[Path], store: Path, history: Path, ref: str) -> "TreeSnapshot":
        """Record the state a failed baseline returns to (reads only)."""
        from pytest_ditgate import git

        saved = {}
        for path in rewritten:
            try:
                saved[_relative(root, path)] = path.read_bytes()
            except FileNotFoundError:
                saved[_relative(root, path)] = None
        return cls(root=root, head=git.head(root), index_tree=git.write_tree(root), saved=saved,
                   store_files=_files(root, store), store_dirs=_dirs(root, store), store=store,
                   untracked=git.untracked(root),
                   history=None if history.exists() else history,
                   ref=None if git.read_blob_ref(root, ref) is not None else ref)

    def restore(self) -> list[str]:
        """Put the tree back as it was when the snapshot was taken; returns what could not be restored (each
        step is tried, whatever an earlier one met). New untracked files outside the golden store are kept and
        named in :attr:`notes`."""
        from pytest_ditgate import git

        problems: list[str] = []

        def attempt(what: str, step) -> None:
            try:
                step()
            except (OSError, git.GitError) as exc:
                problems.append(f"{what}: {exc}")

        if git.head(self.root) != self.head:
            attempt("the branch head", lambda: git.move_head(self.root, self.head))
        attempt("the index", lambda: git.read_tree(self.root, self.index_tree))
        for relative, data in self.saved.items():
            attempt(relative, lambda relative=relative, data=data: _put(self.root / relative, data))
        for relative in sorted(_files(self.root, self.store) - self.store_files):
            attempt(relative, lambda relative=relative: (self.root / relative).unlink(missing_ok=True))
        for relative in sorted(_dirs(self.root, self.store) - self.store_dirs, key=len, reverse=True):
            try:
                (self.root / relative).rmdir()
            except OSError:
                pass  # not empty: something the snapshot did not make is in it
        others = sorted(git_untracked(self.root) - self.untracked - set(self.saved))
        if others:
            self.notes.append(f"left in place, not made by the baseline itself: {', '.join(others[:10])}"
                              + (f" and {len(others) - 10} more" if len(others) > 10 else ""))
        if self.ref is not None and git.read_blob_ref(self.root, self.ref) is not None:
            attempt(self.ref, lambda: git.delete_ref(self.root, self.ref))
        if self.history is not None:
            attempt(str(self.history), lambda: self.history.unlink(missing_ok=True))
        return problems


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) back until the block is done: the records it writes belong together. A signal that
    came meanwhile goes to the handler it was meant for when the block ends. (A handler, not a signal mask: in a
    process with threads, such as one that imported torch, a masked signal is taken by another thread.)"""

    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread receives signals, and may set a handler
        return
    held: list[Any] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if held and callable(previous):
        previous(signal.SIGINT, held[0])


def git_untracked(root: Path) -> set[str]:
    """Untracked, not ignored files now (empty when git cannot say)."""
    from pytest_ditgate import git

    try:
        return git.untracked(root)
    except git.GitError:
        return set()


def _relative(root: Path, path: Path) -> str:
    return path.resolve().relative_to(root.resolve()).as_posix()


def _files(root: Path, folder: Path) -> set[str]:
    if not folder.is_dir():
        return set()
    return {_relative(root, p) for p in folder.rglob("*") if p.is_file() or p.is_symlink()}


def _dirs(root: Path, folder: Path) -> set[str]:
    """``folder`` and the folders below it, when it exists."""
    if not folder.is_dir():
        return set()
    return {_relative(root, folder)} | {_relative(root, p) for p in folder.rglob("*") if p.is_dir()}


def _put(path: Path, data: bytes | None) -> None:
    from pytest_ditgate.fsutil import atomic_write_bytes

    if data is None:
        path.unlink(missing_ok=True)
    elif not path.exists() or path.read_bytes() != data:
        atomic_write_bytes(path, data)
