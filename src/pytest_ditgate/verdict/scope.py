"""The scope rule: which changed paths a candidate may not have changed (the judge computes what changed, against
the lane's anchors: :mod:`pytest_ditgate.experiment.preflight`).

Patterns come from ``[tool.ditgate] mutable_paths`` / ``fixed_paths``: a pattern ending in ``/`` is a folder
(everything below it), ``**/name`` a file name anywhere, anything else an ``fnmatch`` glob on the
repository-relative path (or a folder of that name). A fixed pattern naming a pyproject table
(``pyproject.toml#tool.ditgate``) is the lock's to judge, not the file's.
"""

from __future__ import annotations

import fnmatch

from pytest_ditgate.verdict.outcome import Category


def matches(path: str, pattern: str) -> bool:
    """Whether the repository-relative ``path`` lies under ``pattern``."""
    if "#" in pattern:
        return False  # a pyproject table: the fixed-paths lock judges it, the scope judges the file itself
    if pattern.endswith("/"):
        return path.startswith(pattern)
    if pattern.startswith("**/") and fnmatch.fnmatch(path.rsplit("/", 1)[-1], pattern[3:]):
        return True
    return fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/")


def scope_problems(changed: list[str], mutable: list[str], fixed: list[str]) -> list[tuple[Category, str]]:
    """One problem per changed path a candidate may not change: a fixed path is an integrity failure (12); a
    path outside every mutable pattern is out of scope (13). No mutable pattern declared means nothing is
    mutable: an experiment of a lane without ``mutable_paths`` may change nothing."""
    problems: list[tuple[Category, str]] = []
    for path in changed:
        if any(matches(path, pattern) for pattern in fixed):
            problems.append((Category.INTEGRITY, f"{path}: a fixed path, changed since the lane's anchors"))
        elif not any(matches(path, pattern) for pattern in mutable):
            problems.append((Category.SCOPE, f"{path}: outside the mutable paths ({', '.join(mutable) or 'none declared'})"))
    return problems
