"""The golden manifest (``<golden dir>/manifest.json``): one entry per golden file, written atomically.

An entry records the file's sha256 and size, each tensor's shape and dtype, the device key and the
provenance (torch/diffusers versions, commit, command, time, device, test). Reads of golden files
are verified against it; it is rewritten only by :meth:`Manifest.save` under a file lock.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pytest_ditgate.fsutil import DuplicateKey, atomic_write_json, loads_json

MANIFEST_NAME = "manifest.json"
VERSION = 1
_SHA256 = re.compile(r"[0-9a-f]{64}")


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
        """An entry from its manifest JSON, every field checked; ManifestError naming ``where`` otherwise."""
        if not isinstance(data, dict):
            raise ManifestError(f"{where}: an entry must be an object, got {type(data).__name__}")
        missing = [key for key in ("name", "key", "file", "sha256", "size", "tensors") if key not in data]
        if missing:
            raise ManifestError(f"{where}: malformed entry (missing {', '.join(missing)})")
        for key in ("name", "key", "file", "sha256"):
            if not isinstance(data[key], str):
                raise ManifestError(f"{where}: {key} must be a string, got {data[key]!r}")
        if type(data["size"]) is not int or data["size"] < 0:
            raise ManifestError(f"{where}: size must be an integer >= 0, got {data['size']!r}")
        if not _SHA256.fullmatch(data["sha256"]):
            raise ManifestError(f"{where}: sha256 must be 64 lowercase hex digits, got {data['sha256']!r}")
        if not isinstance(data["tensors"], dict) or not isinstance(data.get("provenance", {}), dict):
            raise ManifestError(f"{where}: tensors and provenance must be objects")
        file = data["file"]
        if file.startswith(("/", "\\")) or "\\" in file or ".." in file.split("/") or ":" in file:
            raise ManifestError(f"{where}: file {file!r} must be a relative path inside the golden folder "
                                "(no '..', no absolute path)")
        return cls(name=data["name"], key=data["key"], file=file, sha256=data["sha256"], size=data["size"],
                   tensors=dict(data["tensors"]), provenance=dict(data.get("provenance", {})))


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
            data = loads_json(file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls(file)
        except DuplicateKey as exc:
            raise ManifestError(f"{file}: golden manifest is malformed: {exc}") from None
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
            raise ManifestError(f"{file}: golden manifest is not valid JSON, or not UTF-8 ({exc})") from None
        except OSError as exc:
            raise ManifestError(f"{file}: golden manifest cannot be read ({exc.strerror or exc})") from None
        if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("entries"), dict):
            raise ManifestError(f"{file}: golden manifest must be {{'version': {VERSION}, 'entries': {{...}}}}")
        entries = {}
        for ident, raw in data["entries"].items():
            entry = GoldenEntry.from_dict(raw, f"{file} entry {ident!r}")
            if entry.id != ident:
                raise ManifestError(f"{file} entry {ident!r}: its key and name say {entry.id!r}")
            entries[ident] = entry
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
