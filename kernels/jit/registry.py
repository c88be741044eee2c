"""Every spec created in this process, for ``python -m kernels status`` and ahead-of-time builds."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kernels.jit.spec import JitSpec

_SPECS: dict[str, "JitSpec"] = {}
_LOCK = threading.Lock()


def register(spec: "JitSpec") -> "JitSpec":
    with _LOCK:
        _SPECS[spec.name] = spec
    return spec


def specs() -> list["JitSpec"]:
    with _LOCK:
        return [_SPECS[name] for name in sorted(_SPECS)]
