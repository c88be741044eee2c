"""pytest-ditgate: GPU correctness, speed and quality gates as pytest outcomes.

Importing this package is cheap: the public names below are resolved lazily, so that an installed
plugin never makes a pytest run pay for torch, diffusers or NVML.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_ditgate.lazy import lazy_exports

__version__ = "0.1.0"

# public name -> module that defines it (imported on first attribute access)
_LAZY = {
    "DeviceInfo": "pytest_ditgate.device_info",
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
    "rated": "pytest_ditgate.bench.rated",
    "import_or_skip": "pytest_ditgate.skipping",
}

__all__ = ["__version__", *_LAZY]


__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY)


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from pytest_ditgate.device import current_device, detect_device
    from pytest_ditgate.device_info import DeviceInfo
    from pytest_ditgate.errors import GateFailure
    from pytest_ditgate.profiles import load_profile
