"""Experiment verdicts: KEEP / DISCARD (quality, performance, integrity, scope) / CRASH as test outcomes."""

from pytest_ditgate.verdict.outcome import EXIT_CODES, Category, Status, GateOutcome, Verdict, decide

__all__ = ["EXIT_CODES", "Category", "Status", "GateOutcome", "Verdict", "decide"]
