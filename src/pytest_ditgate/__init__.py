"""pytest-ditgate: GPU correctness, speed and quality gates as pytest outcomes.

Importing this package is cheap: the public names below are resolved lazily, so that an installed
plugin never makes a pytest run pay for torch, diffusers or NVML.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it (imported on first attribute access)
_LAZY = {
    "DeviceInfo": "pytest_ditgate.device",
    "current_device": "pytest_ditgate.device",
    "detect_device": "pytest_ditgate.device",
    "load_profile": "pytest_ditgate.profiles",
    "GateFailure": "pytest_ditgate.errors",
    "check_kernel": "pytest_ditgate.correctness",
    "KernelReport": "pytest_ditgate.correctness",
    "tolerance_for": "pytest_ditgate.correctness",
    "measure": "pytest_ditgate.bench",
    "Measurement": "pytest_ditgate.bench",
    "compare": "pytest_ditgate.bench",
    "Comparison": "pytest_ditgate.bench",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_ditgate' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from pytest_ditgate.device import DeviceInfo, current_device, detect_device
    from pytest_ditgate.errors import GateFailure
    from pytest_ditgate.profiles import load_profile
