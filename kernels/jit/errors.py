"""Errors of the JIT core, each naming the module (URI) it is about so a failure says what to fix."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable


def format_archs(archs: Iterable[tuple[int, int]]) -> str:
    """``[(8, 6), (9, 0)]`` -> ``"8.6, 9.0"``: how every message of the JIT names target archs."""
    return ", ".join(f"{a}.{b}" for a, b in archs)


class JitError(RuntimeError):
    """Base class for every failure of the kernel JIT (build, load, arch selection, toolkit)."""


class ToolkitNotFoundError(JitError):
    """No usable CUDA toolkit (nvcc) was found."""


class UnsupportedArchError(JitError):
    """None of the requested target archs is supported by a module (or none could be determined)."""

    def __init__(self, module: str, requested: list[tuple[int, int]], supported: list[tuple[int, int]],
                 detail: str = "") -> None:
        self.module = module
        self.requested = list(requested)
        self.supported = list(supported)
        message = (f"kernel module {module!r}: none of the requested target archs [{format_archs(requested)}] "
                   f"is supported; it supports [{format_archs(supported)}]. Nothing was compiled (the JIT "
                   f"never builds silently for another arch family).")
        if detail:
            message += " " + detail
        super().__init__(message)


class MissingJitCacheError(JitError):
    """Compiling is forbidden (``DITGATE_KERNELS_NO_COMPILE=1``) and no valid cached artefact exists."""

    def __init__(self, module: str, artefact: Path, why: str) -> None:
        self.module = module
        self.artefact = artefact
        super().__init__(
            f"kernel module {module!r} is not in the JIT cache ({why}: {artefact}) and compiling is "
            f"forbidden by DITGATE_KERNELS_NO_COMPILE=1; build it first (python -m kernels build) or unset it")


class BuildError(JitError):
    """The compiler failed; the message carries the command log tail and the build folder."""

    def __init__(self, module: str, build_dir: Path, log_tail: str) -> None:
        self.module = module
        self.build_dir = build_dir
        super().__init__(f"building kernel module {module!r} failed (build folder {build_dir}):\n{log_tail}")


class LockTimeoutError(JitError):
    """Another process held the module's build lock for longer than the allowed wait."""
