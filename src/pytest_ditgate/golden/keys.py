"""Device keys for goldens and the fallback chain used when the exact key has no golden.

Goldens are filed by the device that computed them: ``sm_86``, ``sm_90``, ... or ``cpu``. A lookup
tries, in order, each step with the tolerance scale the comparator must apply:

1. the exact arch (``sm_86``), scale 1;
2. the same arch family (``sm_8x``: other ``sm_8?`` keys that have a golden, nearest minor version
   first), scale :data:`FAMILY_SCALE` (same instruction generation, different kernels and SM counts);
3. ``cpu`` (the float32 reference computed on the CPU), scale :data:`CPU_SCALE`.

A ``cpu`` lookup has only step 1. The result of a lookup says which step was used.

A **machine key** (``cpu.1a2b3c4d``, ``sm_90.0f9e8d7c``) names one machine: the device key plus a hash of
what decides bitwise results there (device or CPU model, torch/CUDA/cuDNN versions, threads). Bitwise
(``exact``) claims are judged only against goldens of the same machine key, so its lookup has no fallback.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

FAMILY_SCALE = 2.0
CPU_SCALE = 4.0
CPU_KEY = "cpu"
_ARCH = re.compile(r"^sm_(\d+?)(\d)$")
_KEY = re.compile(r"^(cpu|sm_\d{2,3})(\.[0-9a-f]{8})?\Z")


@dataclass(frozen=True)
class KeyStep:
    """One step of a fallback chain: the key to read and the tolerance scale that goes with it."""

    key: str
    tolerance_scale: float
    rule: str  # "exact", "family sm_8x", "cpu"

    @property
    def fallback(self) -> bool:
        return self.rule != "exact"


def validate_key(key: str) -> str:
    """``key`` if it is a device key (``cpu`` or ``sm_XY``), else ``ValueError``."""
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise ValueError(f"bad golden device key {key!r}: use 'cpu' or an arch such as 'sm_86' "
                         "(a machine key adds '.' and 8 hex digits: 'cpu.1a2b3c4d')")
    return key


def is_machine_key(key: str) -> bool:
    """Whether ``key`` names one machine (``cpu.1a2b3c4d``) rather than a device kind (``cpu``)."""
    return "." in validate_key(key)


def device_of(key: str) -> str:
    """The device key a key names first: ``cpu`` for ``cpu`` and ``cpu.1a2b3c4d``; ``ValueError`` if not a key."""
    return validate_key(key).split(".", 1)[0]


def machine_key(device_key: str, fingerprint: str) -> str:
    """The machine key for ``device_key`` on the machine described by ``fingerprint`` (any text)."""
    import hashlib

    if is_machine_key(device_key):
        raise ValueError(f"{device_key!r} is already a machine key")
    return f"{device_key}.{hashlib.sha256(fingerprint.encode()).hexdigest()[:8]}"


def family(key: str) -> str | None:
    """``sm_8x`` for ``sm_86``; None for ``cpu``."""
    match = _ARCH.match(key)
    return f"sm_{match.group(1)}x" if match else None


def fallback_chain(key: str, available: Iterable[str]) -> list[KeyStep]:
    """The lookup order for ``key``; family members are taken from ``available`` (keys that have goldens).
    A machine key has no fallback: a bitwise claim against another machine's golden means nothing."""
    chain = [KeyStep(key, 1.0, "exact")]
    fam = None if is_machine_key(key) else family(key)
    if fam is None:
        return chain
    minor = int(_ARCH.match(key).group(2))  # type: ignore[union-attr]
    members = sorted(
        (k for k in set(available) if k != key and family(k) == fam),
        key=lambda k: (abs(int(_ARCH.match(k).group(2)) - minor), k),  # type: ignore[union-attr]
    )
    chain += [KeyStep(k, FAMILY_SCALE, f"family {fam}") for k in members]
    chain.append(KeyStep(CPU_KEY, CPU_SCALE, "cpu"))
    return chain
