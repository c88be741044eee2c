"""Experiment verdicts: KEEP / DISCARD (quality, performance, integrity, scope) / CRASH as test outcomes."""

from pytest_ditgate.lazy import lazy_exports

_LAZY = {name: "pytest_ditgate.verdict.outcome"
         for name in ("EXIT_CODES", "Category", "Status", "GateOutcome", "Verdict", "decide")}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY)
