"""Target architectures: requested (explicit list, env var or visible GPUs), filtered per module.

An arch is a ``(major, minor)`` pair. A module lists the archs it supports; the requested ones are
matched at major.minor precision and the rest dropped. When nothing is left the build fails naming the
module, the requested and the supported archs: compiling for another family instead would hand out
code that runs (through PTX JIT) but was never built or tested for that chip.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

from kernels.jit import env
from kernels.jit.errors import UnsupportedArchError

Arch = tuple[int, int]

_ARCH_RE = re.compile(r"^(?:sm_|compute_)?(\d+)(?:\.(\d+))?$")


def parse_arch(text: str) -> Arch:
    """``"8.6"``, ``"sm_86"``, ``"86"`` or ``"9.0"`` -> ``(8, 6)``; raises ValueError otherwise."""
    item = text.strip().lower()
    match = _ARCH_RE.match(item)
    if not match:
        raise ValueError(f"cannot read target arch {text!r}: write it as 8.6, 9.0 or sm_86")
    major, minor = match.group(1), match.group(2)
    if minor is None:  # "86" or "sm_86": last digit is the minor
        if len(major) < 2:
            raise ValueError(f"cannot read target arch {text!r}: write it as 8.6, 9.0 or sm_86")
        major, minor = major[:-1], major[-1]
    return int(major), int(minor)


def parse_archs(text: str | Iterable[str | Arch]) -> list[Arch]:
    """A list of archs from ``"8.6 9.0"``, ``"sm_86,sm_90"``, ``"8.6;9.0"`` or an iterable; sorted, unique."""
    if isinstance(text, str):
        items: list[str | Arch] = [t for t in re.split(r"[\s,;]+", text) if t]
    else:
        items = list(text)
    archs = {tuple(item) if not isinstance(item, str) else parse_arch(item) for item in items}
    if not archs:
        raise ValueError("empty list of target archs")
    return sorted((int(a[0]), int(a[1])) for a in archs)


def visible_gpu_archs() -> list[Arch]:
    """Compute capabilities of every visible CUDA device (empty when there is none)."""
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    return sorted({tuple(torch.cuda.get_device_capability(i)) for i in range(torch.cuda.device_count())})


def requested_archs(explicit: str | Sequence[str | Arch] | None = None) -> tuple[list[Arch], str]:
    """The archs asked for and where the request came from: the argument, the env var, or the GPUs."""
    if explicit is not None:
        return parse_archs(explicit), "argument"
    text = env.archs_text()
    if text:
        try:
            return parse_archs(text), env.ARCHS
        except ValueError as exc:
            raise ValueError(f"{env.ARCHS}={text!r}: {exc}") from None
    return visible_gpu_archs(), "visible GPU"


def select_archs(module: str, supported: Sequence[Arch],
                 explicit: str | Sequence[str | Arch] | None = None) -> list[Arch]:
    """The requested archs that ``module`` supports; :class:`UnsupportedArchError` when none is left."""
    requested, source = requested_archs(explicit)
    if not requested:
        raise UnsupportedArchError(module, [], list(supported),
                                   f"No CUDA GPU is visible to take the arch from; name targets with "
                                   f"{env.ARCHS}=\"8.6 9.0\" or the archs= argument.")
    chosen = [arch for arch in requested if arch in set(map(tuple, supported))]
    if not chosen:
        raise UnsupportedArchError(module, requested, list(supported), f"(requested by {source})")
    return chosen


def gencode_flags(archs: Sequence[Arch]) -> list[str]:
    """SASS for every arch plus PTX for the newest (forward compatibility for later chips of the family)."""
    ordered = sorted(archs)
    flags = [f"-gencode=arch=compute_{a}{b},code=sm_{a}{b}" for a, b in ordered]
    a, b = ordered[-1]
    flags.append(f"-gencode=arch=compute_{a}{b},code=compute_{a}{b}")
    return flags
