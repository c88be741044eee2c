"""Versions of the host toolchain (nvcc, triton) found without importing torch or triton."""

from __future__ import annotations

import functools
import importlib.metadata
import re
import shutil
import subprocess


@functools.lru_cache(maxsize=1)
def nvcc_version() -> str | None:
    """``release X.Y`` of the first ``nvcc`` reachable through ``CUDA_HOME``/``PATH``, or None."""
    import os

    candidates = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root:
            candidates.append(os.path.join(root, "bin", "nvcc"))
    found = shutil.which("nvcc")
    if found:
        candidates.append(found)
    for exe in candidates:
        if not os.path.exists(exe):
            continue
        try:
            out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        match = re.search(r"release (\d+\.\d+)", out)
        if match:
            return match.group(1)
    return None


def package_version(dist: str) -> str | None:
    """Installed version of distribution ``dist`` from its metadata (no import), or None."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def triton_version() -> str | None:
    return package_version("triton") or package_version("pytorch-triton")
