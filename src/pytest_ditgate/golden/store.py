"""Where golden files live and how they are read and written, every read verified against the manifest.

Layout: ``<golden dir>/<device key>/<name>.safetensors`` plus ``<golden dir>/manifest.json``. A read
fails with :class:`GoldenIntegrityError` naming the file when it is missing, truncated, altered (sha256),
unparsable, untracked by the manifest, or holds tensors other than the manifest says.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_ditgate.errors import DitgateUsageError, GateFailure
from pytest_ditgate.fsutil import atomic_write_bytes
from pytest_ditgate.golden.keys import validate_key
from pytest_ditgate.golden.manifest import MANIFEST_NAME, GoldenEntry, Manifest
from pytest_ditgate.golden.serializer import SafetensorsSerializer

if TYPE_CHECKING:
    import torch

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


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
        path = self.root / entry.file
        hint = "restore it from version control or run pytest --ditgate --ditgate-refreeze"
        try:
            expected = self.relative(entry.name, entry.key)
        except ValueError as exc:
            raise GoldenIntegrityError(f"{self.manifest_path}: entry {entry.id!r}: {exc}") from None
        if entry.file != expected or not self.inside(path):
            raise GoldenIntegrityError(f"{self.manifest_path}: entry {entry.id!r} names file {entry.file!r}; it must be "
                                       f"{expected!r} inside {self.root} (a manifest never points elsewhere)")
        if not path.exists() and not path.is_symlink():
            raise GoldenIntegrityError(f"golden file {path} is listed in {self.manifest_path} but missing; {hint}")
        if not path.is_file():
            kind = "a folder" if path.is_dir() else "not a regular file"
            raise GoldenIntegrityError(f"golden {entry.id!r}: {path} is {kind}, where its golden file should be; {hint}")
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise GoldenIntegrityError(f"golden {entry.id!r}: its file {path} cannot be read "
                                       f"({exc.strerror or exc}); check its permissions, or {hint}") from None
        if len(data) != entry.size:
            state = "truncated" if len(data) < entry.size else "longer than recorded"
            raise GoldenIntegrityError(f"golden file {path} is {state}: {len(data)} bytes, manifest says {entry.size}; {hint}")
        digest = sha256_bytes(data)
        if digest != entry.sha256:
            raise GoldenIntegrityError(f"golden file {path} was modified: sha256 {digest[:16]}..., manifest says "
                                       f"{entry.sha256[:16]}...; {hint}")
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

    def untracked_files(self, manifest: Manifest) -> list[str]:
        """Golden-format files under the root that no manifest entry names (relative paths, sorted)."""
        if not self.root.is_dir():
            return []
        tracked = {entry.file for entry in manifest.entries.values()}
        pattern = f"*/*{self.serializer.file_extension}"
        return sorted(p.relative_to(self.root).as_posix() for p in self.root.glob(pattern)
                      if p.relative_to(self.root).as_posix() not in tracked)

    def write(self, relative: str, data: bytes) -> Path:
        return atomic_write_bytes(self.root / relative, data)
