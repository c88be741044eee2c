"""Where golden files live and how they are read and written, every read verified against the manifest.

Layout: ``<golden dir>/<device key>/<name>.safetensors`` plus ``<golden dir>/manifest.json``. A read
fails with :class:`GoldenIntegrityError` naming the file when it is missing, truncated, altered (sha256),
unparsable, untracked by the manifest, holds tensors other than the manifest says, or resolves outside the
store through a symlink; a write that would land outside the store is refused the same way, before anything
is written. A read whose bytes disagree with the manifest it was given re-reads the manifest under its lock:
a concurrent freeze may have replaced the file since, and only a disagreement with the manifest as it now is
counts as tampering.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_ditgate.errors import DitgateUsageError, GateFailure
from pytest_ditgate.fsutil import atomic_write_bytes, lock_for
from pytest_ditgate.golden.keys import validate_key
from pytest_ditgate.golden.manifest import MANIFEST_NAME, GoldenEntry, Manifest, ManifestError
from pytest_ditgate.golden.serializer import SafetensorsSerializer

if TYPE_CHECKING:
    import torch

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
#: how long a read whose file disagrees with the manifest waits for a concurrent freeze to finish its flush
LOCK_WAIT_S = 120.0
READ_HINT = "restore it from version control or run pytest --ditgate --ditgate-refreeze"
LINK_HINT = ("replace the link with the real folder or file (a golden store holds its own files; a symlink to the "
             "whole golden folder is fine)")


class GoldenIntegrityError(GateFailure):
    """A golden file does not match its manifest entry (reason ``golden_integrity``)."""

    def __init__(self, message: str) -> None:
        super().__init__("golden_integrity", message)


def validate_name(name: str) -> str:
    """``name`` when it is safe as a file name (letters, digits, ``.``, ``-``, ``_``; no trailing newline,
    no ``..``); DitgateUsageError (a ValueError) naming the allowed characters otherwise."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name or len(name) > 200:
        raise DitgateUsageError(f"bad golden name {name!r}: use letters, digits, '.', '-' and '_', starting with a letter "
                         "or digit, no '..', at most 200 characters (it becomes a file name)")
    return name


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class GoldenStore:
    """Location, manifest and serializer of one golden directory."""

    root: Path
    serializer: Any = None

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        if self.serializer is None:
            self.serializer = SafetensorsSerializer()

    @property
    def manifest_path(self) -> Path:
        return self.root / MANIFEST_NAME

    def relative(self, name: str, key: str) -> str:
        return f"{validate_key(key)}/{validate_name(name)}{self.serializer.file_extension}"

    def location(self, name: str, key: str) -> Path:
        return self.root / self.relative(name, key)

    def load_manifest(self) -> Manifest:
        """The manifest, with what an interrupted freeze wrote whole (``journal.py``): never written here."""
        from pytest_ditgate.golden.journal import with_completed

        return with_completed(self, Manifest.load(self.manifest_path))

    def read(self, entry: GoldenEntry) -> dict[str, "torch.Tensor"]:
        """The tensors of ``entry``, after checking size, sha256 and tensor list against the manifest."""
        __tracebackhide__ = True
        return self.read_current(entry)[1]

    def read_current(self, entry: GoldenEntry) -> tuple[GoldenEntry, dict[str, "torch.Tensor"]]:
        """The entry the golden file was verified against and its tensors. ``entry`` comes from a manifest read
        earlier; when the file's bytes disagree with it, the manifest is read again under its lock (a freeze
        or refreeze flushing meanwhile holds it) and the file is judged against the entry it lists now."""
        __tracebackhide__ = True
        path = self._verified_path(entry)
        data = self._bytes(entry, path)
        if _agrees(entry, data):
            return entry, self._tensors(entry, path, data)
        current, data = self._settled(entry, path)
        if current != entry:
            path = self._verified_path(current)
        _check_bytes(current, path, data)
        return current, self._tensors(current, path, data)

    def _verified_path(self, entry: GoldenEntry) -> Path:
        """The path of ``entry``'s file, once the manifest names the right one and it is a regular file inside
        the store."""
        __tracebackhide__ = True
        path = self.root / entry.file
        try:
            expected = self.relative(entry.name, entry.key)
        except ValueError as exc:
            raise GoldenIntegrityError(f"{self.manifest_path}: entry {entry.id!r}: {exc}") from None
        if entry.file != expected:
            raise GoldenIntegrityError(f"{self.manifest_path}: entry {entry.id!r} names file {entry.file!r}; it must be "
                                       f"{expected!r} inside {self.root} (a manifest never points elsewhere)")
        escape = self.escape(path)
        if escape is not None:
            raise GoldenIntegrityError(f"golden {entry.id!r}: its file {escape}; {LINK_HINT}")
        if not path.exists() and not path.is_symlink():
            raise GoldenIntegrityError(f"golden file {path} is listed in {self.manifest_path} but missing; {READ_HINT}")
        if not path.is_file():
            kind = "a folder" if path.is_dir() else "not a regular file"
            raise GoldenIntegrityError(f"golden {entry.id!r}: {path} is {kind}, where its golden file should be; "
                                       f"{READ_HINT}")
        return path

    def _bytes(self, entry: GoldenEntry, path: Path) -> bytes:
        __tracebackhide__ = True
        try:
            return path.read_bytes()
        except OSError as exc:
            raise GoldenIntegrityError(f"golden {entry.id!r}: its file {path} cannot be read "
                                       f"({exc.strerror or exc}); check its permissions, or {READ_HINT}") from None

    def _settled(self, entry: GoldenEntry, path: Path) -> tuple[GoldenEntry, bytes]:
        """``entry`` as the manifest lists it now and the file's bytes, both read under the manifest lock (no
        flush is half done then). Without the lock (a read-only store, a flush that takes too long) they are
        read as they are."""
        __tracebackhide__ = True
        lock = lock_for(self.manifest_path)
        try:
            lock.acquire(timeout=LOCK_WAIT_S)
        except OSError:  # the lock file cannot be made, or the wait timed out (filelock's Timeout)
            lock = None
        try:
            try:
                current = self.load_manifest().entries.get(entry.id) or entry
            except ManifestError as exc:
                raise GoldenIntegrityError(str(exc)) from None
            return current, self._bytes(current, path)
        finally:
            if lock is not None:
                lock.release()

    def _tensors(self, entry: GoldenEntry, path: Path, data: bytes) -> dict[str, "torch.Tensor"]:
        __tracebackhide__ = True
        try:
            tensors = self.serializer.deserialize(data)
        except Exception as exc:  # a hash collision is not a concern; a bad serializer is
            raise GoldenIntegrityError(f"golden file {path} cannot be parsed ({exc})") from None
        described = self.serializer.describe(tensors)
        if described != dict(sorted(entry.tensors.items())):
            raise GoldenIntegrityError(f"golden file {path} holds tensors {described}, manifest says {entry.tensors}")
        return tensors

    def inside(self, path: Path) -> bool:
        """Whether ``path`` resolves (symlinks followed) to a place inside the golden root."""
        root = self.root.resolve()
        try:
            return path.resolve().is_relative_to(root)
        except OSError:
            return False

    def escape(self, path: Path) -> str | None:
        """How ``path`` (under the root) leaves the store: ``<path> resolves outside <root> through the symlink
        <link> -> <target>``, naming the first link on the way that leads out; None when it stays inside. The
        root itself may be a link (a golden folder kept elsewhere): only what lies below it is judged."""
        if self.inside(path):
            return None
        current, link = self.root, None
        for part in path.relative_to(self.root).parts:
            current = current / part
            if current.is_symlink() and not self.inside(current):
                link = current
                break
        if link is None:
            return f"{path} resolves outside {self.root}"
        try:
            target = os.readlink(link)
        except OSError:
            target = "?"
        return f"{path} resolves outside {self.root} through the symlink {link} -> {target}"

    def untracked_files(self, manifest: Manifest) -> list[str]:
        """Golden-format files under the root that no manifest entry names (relative paths, sorted)."""
        if not self.root.is_dir():
            return []
        tracked = {entry.file for entry in manifest.entries.values()}
        pattern = f"*/*{self.serializer.file_extension}"
        return sorted(p.relative_to(self.root).as_posix() for p in self.root.glob(pattern)
                      if p.relative_to(self.root).as_posix() not in tracked)

    def write(self, relative: str, data: bytes) -> Path:
        """Write a golden file atomically; one that would land outside the store (through a symlink) is refused
        before anything is written, as a read would refuse it."""
        __tracebackhide__ = True
        path = self.root / relative
        escape = self.escape(path)
        if escape is not None:
            raise GoldenIntegrityError(f"{escape}: not written; {LINK_HINT}")
        return atomic_write_bytes(path, data)


def _agrees(entry: GoldenEntry, data: bytes) -> bool:
    return len(data) == entry.size and sha256_bytes(data) == entry.sha256


def _check_bytes(entry: GoldenEntry, path: Path, data: bytes) -> None:
    """GoldenIntegrityError naming ``path`` when ``data`` is not the file ``entry`` lists (size, then sha256)."""
    __tracebackhide__ = True
    if len(data) != entry.size:
        state = "truncated" if len(data) < entry.size else "longer than recorded"
        raise GoldenIntegrityError(f"golden file {path} is {state}: {len(data)} bytes, manifest says {entry.size}; "
                                   f"{READ_HINT}")
    digest = sha256_bytes(data)
    if digest != entry.sha256:
        raise GoldenIntegrityError(f"golden file {path} was modified: sha256 {digest[:16]}..., manifest says "
                                   f"{entry.sha256[:16]}...; {READ_HINT}")
