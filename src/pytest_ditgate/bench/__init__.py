"""The GPU benchmark recorder: true device time, timer provenance, noise-aware comparisons.

Torch-free at import, and light: the recorder's modules load on first use of a public name.
"""

from __future__ import annotations

from pytest_ditgate.lazy import lazy_exports

_LAZY = {
    "Comparison": "pytest_ditgate.bench.comparison",
    "compare": "pytest_ditgate.bench.comparison",
    "Measurement": "pytest_ditgate.bench.measurement",
    "PhaseProfile": "pytest_ditgate.bench.profiling",
    "measure": "pytest_ditgate.bench.runner",
    "measure_pair": "pytest_ditgate.bench.runner",
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY)
