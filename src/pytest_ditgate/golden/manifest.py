"""The golden manifest (``<golden dir>/manifest.json``): one entry per golden file, written atomically.

An entry records the file's sha256 and size, each tensor's shape and dtype, the device key and the
provenance (torch/diffusers versions, commit, command, time, device, test). Reads of golden files
are verified against it; it is rewritten only by :meth:`Manifest.save` under a file lock.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pytest_ditgate.fsutil import atomic_write_json

MANIFEST_NAME = "manifest.json"
VERSION = 1


class ManifestError(ValueError):
    """The manifest cannot be read or is malformed (the message names the file)."""


@dataclass(frozen=True)
class GoldenEntry:
    """What the manifest knows about one golden file."""

    name: str
    key: str
    file: str  # relative to the golden dir, with '/' separators
    sha256: str
    size: int
    tensors: dict[str, dict[str, Any]]  # tensor name -> {"shape": [...], "dtype": "float32"}
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.key}/{self.name}"

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> "GoldenEntry":
        try:
            return cls(name=str(data["name"]), key=str(data["key"]), file=str(data["file"]),
                       sha256=str(data["sha256"]), size=int(data["size"]), tensors=dict(data["tensors"]),
                       provenance=dict(data.get("provenance", {})))
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"{where}: malformed entry ({exc!r})") from None


@dataclass
class Manifest:
    """All entries, keyed by ``<key>/<name>``."""

    path: Path
    entries: dict[str, GoldenEntry] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | Path) -> "Manifest":
        """The manifest at ``path``; an absent file is an empty manifest, a corrupt one raises ManifestError."""
        file = Path(path)
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls(file)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ManifestError(f"{file}: golden manifest is not valid JSON ({exc})") from None
        if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("entries"), dict):
            raise ManifestError(f"{file}: golden manifest must be {{'version': {VERSION}, 'entries': {{...}}}}")
        entries = {ident: GoldenEntry.from_dict(raw, f"{file} entry {ident!r}") for ident, raw in data["entries"].items()}
        return cls(file, entries)

    def get(self, name: str, key: str) -> GoldenEntry | None:
        return self.entries.get(f"{key}/{name}")

    def keys_for(self, name: str) -> set[str]:
        return {entry.key for entry in self.entries.values() if entry.name == name}

    def put(self, entry: GoldenEntry) -> None:
        self.entries[entry.id] = entry

    def save(self) -> None:
        """Write atomically (callers hold the manifest lock)."""
        data = {"version": VERSION, "entries": {ident: asdict(self.entries[ident]) for ident in sorted(self.entries)}}
        atomic_write_json(self.path, data)
