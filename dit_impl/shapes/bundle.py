"""The shipped shapes weights (``fixtures/shapes/``): where they are, and a sha256 check against the manifest.

``manifest.json`` lists every file with its sha256 and size, next to how the weights were made
(training command, data seed, steps, device). A missing, changed or unlisted weights file is a
:class:`BundleError` naming it, before any tensor is read.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

WEIGHTS_DIR = Path(__file__).resolve().parent.parent.parent / "fixtures" / "shapes"
MANIFEST = "manifest.json"
TRANSFORMER = "transformer"
CLASSIFIER = "classifier.safetensors"


class BundleError(ValueError):
    """The weights bundle is missing, incomplete or does not match its manifest (names the file)."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_manifest(folder: Path = WEIGHTS_DIR) -> dict[str, Any]:
    path = folder / MANIFEST
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BundleError(f"{path} is missing: the shapes weights are made by scripts/train_shapes.py") from None
    except (OSError, ValueError) as exc:
        raise BundleError(f"{path} is not readable JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict) or not data["files"]:
        raise BundleError(f"{path} has no 'files' table of name -> {{sha256, bytes}}")
    return data


def verify_bundle(folder: Path = WEIGHTS_DIR) -> dict[str, Any]:
    """Check every listed file's size and sha256, and that no weights file is unlisted; the manifest."""
    manifest = read_manifest(folder)
    for name, entry in manifest["files"].items():
        path = folder / name
        if not path.is_file():
            raise BundleError(f"{path} is listed in {folder / MANIFEST} but missing")
        if path.stat().st_size != entry.get("bytes") or sha256_of(path) != entry.get("sha256"):
            raise BundleError(f"{path} does not match {folder / MANIFEST} (sha256 or size changed): the shipped "
                              "weights were altered; restore them or retrain with scripts/train_shapes.py")
    listed = {folder / name for name in manifest["files"]}
    extra = sorted(str(p) for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST and p not in listed)
    if extra:
        raise BundleError(f"{folder}: file(s) not in {MANIFEST}: {', '.join(extra)}")
    return manifest


def describe_files(folder: Path) -> dict[str, dict[str, Any]]:
    """``name -> {sha256, bytes}`` for every file under ``folder`` except the manifest (for writing it)."""
    return {str(p.relative_to(folder)): {"sha256": sha256_of(p), "bytes": p.stat().st_size}
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != MANIFEST}
