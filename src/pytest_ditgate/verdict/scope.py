"""Scope patterns: whether a changed path lies inside the mutable paths (the judge computes what changed,
against the lane's anchors: :mod:`pytest_ditgate.experiment.judge`).

Patterns come from ``[tool.ditgate] mutable_paths`` / ``fixed_paths``: a pattern ending in ``/`` is a
folder (everything below it), anything else an ``fnmatch`` glob on the repository-relative path.
"""

from __future__ import annotations

import fnmatch


def matches(path: str, pattern: str) -> bool:
    if pattern.endswith("/"):
        return path.startswith(pattern)
    return fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/")


def scope_violations(changed: list[str], mutable: list[str], fixed: list[str]) -> list[str]:
    """One readable line per changed path that is fixed, or outside every mutable pattern."""
    problems = []
    for path in changed:
        if any(matches(path, pattern) for pattern in fixed):
            problems.append(f"{path}: a fixed path (never edited by a candidate)")
        elif mutable and not any(matches(path, pattern) for pattern in mutable):
            problems.append(f"{path}: outside the mutable paths ({', '.join(mutable)})")
    return problems
