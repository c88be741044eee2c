"""Workspaces and switches of the kernel JIT, read from the environment at call time.

Read values through this module's functions (``env.cache_dir()``), never copy them at import: tests and
users change the variables between calls. Nothing here creates a folder; callers create what they write.

| variable                        | meaning                                                          |
|---------------------------------|------------------------------------------------------------------|
| DITGATE_KERNELS_CACHE_DIR       | compiled artefacts, metadata, build folders, locks               |
| DITGATE_KERNELS_GEN_DIR         | generated sources and copied compile units                       |
| DITGATE_KERNELS_ARCHS           | explicit target archs, e.g. ``"8.6 9.0"`` (default: visible GPUs) |
| DITGATE_KERNELS_NO_COMPILE=1    | never compile: use the cache or fail naming the module           |
| DITGATE_KERNELS_NO_CACHE=1      | diagnosis: build into a fresh temporary folder, ignore the cache |
| DITGATE_KERNELS_MAX_JOBS        | parallel compile jobs (default: min(4, CPUs))                    |
| DITGATE_KERNELS_LOCK_TIMEOUT    | seconds to wait for another process's build (default 900)        |
| DITGATE_KERNELS_LINEINFO=1      | add ``-lineinfo`` (profilers map SASS to source lines)           |
| CUDA_HOME                       | the CUDA toolkit to use (default: ask the ``nvcc`` on PATH)       |
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR = "DITGATE_KERNELS_CACHE_DIR"
GEN_DIR = "DITGATE_KERNELS_GEN_DIR"
ARCHS = "DITGATE_KERNELS_ARCHS"
NO_COMPILE = "DITGATE_KERNELS_NO_COMPILE"
NO_CACHE = "DITGATE_KERNELS_NO_CACHE"
MAX_JOBS = "DITGATE_KERNELS_MAX_JOBS"
LOCK_TIMEOUT = "DITGATE_KERNELS_LOCK_TIMEOUT"
LINEINFO = "DITGATE_KERNELS_LINEINFO"


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _base() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME")
    root = Path(xdg) if xdg else Path.home() / ".cache"
    return root / "ditgate" / "kernels"


def cache_dir() -> Path:
    """Where compiled modules live: ``$DITGATE_KERNELS_CACHE_DIR`` or ``~/.cache/ditgate/kernels/cache``."""
    raw = os.environ.get(CACHE_DIR)
    return Path(raw).expanduser().absolute() if raw else _base() / "cache"


def gen_dir() -> Path:
    """Where generated sources go: ``$DITGATE_KERNELS_GEN_DIR`` or ``~/.cache/ditgate/kernels/generated``."""
    raw = os.environ.get(GEN_DIR)
    return Path(raw).expanduser().absolute() if raw else _base() / "generated"


def archs_text() -> str | None:
    return os.environ.get(ARCHS) or None


def no_compile() -> bool:
    return _flag(NO_COMPILE)


def no_cache() -> bool:
    return _flag(NO_CACHE)


def lineinfo() -> bool:
    return _flag(LINEINFO)


def max_jobs() -> int:
    """Bounded build parallelism: each nvcc job takes about 1 GB of host memory at its peak."""
    raw = os.environ.get(MAX_JOBS)
    if raw:
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"{MAX_JOBS}={raw!r} is not an integer") from None
        if value < 1:
            raise ValueError(f"{MAX_JOBS}={raw!r} must be >= 1")
        return value
    return max(1, min(4, os.cpu_count() or 1))


def lock_timeout() -> float:
    raw = os.environ.get(LOCK_TIMEOUT)
    return float(raw) if raw else 900.0
