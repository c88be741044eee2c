"""The GPU benchmark recorder: true device time, timer provenance, noise-aware comparisons.

Torch-free at import: torch is imported only when something is measured.
"""

from __future__ import annotations

from pytest_ditgate.bench.compare import Comparison, compare
from pytest_ditgate.bench.measurement import Measurement
from pytest_ditgate.bench.runner import measure, measure_pair

__all__ = ["Comparison", "Measurement", "compare", "measure", "measure_pair"]
