"""The reference-checked kernel correctness gate: :func:`check_kernel` and the ``kernel_check`` fixture.

Importing this package is torch-free (``plugin.py`` imports it at load time); the checking machinery is
imported on first use of a public name.
"""

from __future__ import annotations

from pytest_ditgate.lazy import lazy_exports

_LAZY = {
    "check_kernel": "pytest_ditgate.correctness.checks",
    "KernelReport": "pytest_ditgate.correctness.report",
    "TrialReport": "pytest_ditgate.correctness.report",
    "OutputComparison": "pytest_ditgate.correctness.report",
    "HonestBound": "pytest_ditgate.correctness.report",
    "HonestRule": "pytest_ditgate.correctness.tolerances",
    "REASONS": "pytest_ditgate.correctness.report",
    "Tolerance": "pytest_ditgate.correctness.tolerances",
    "tolerance_for": "pytest_ditgate.correctness.tolerances",
    "TOLERANCES": "pytest_ditgate.correctness.tolerances",
}

__all__ = list(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY)
