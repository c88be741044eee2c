"""Scope of a candidate: which files it changed, and whether each lies inside the mutable paths.

Patterns come from ``[tool.ditgate] mutable_paths`` / ``fixed_paths``: a pattern ending in ``/`` is a
folder (everything below it), anything else an ``fnmatch`` glob on the repository-relative path.
"""

from __future__ import annotations

import fnmatch
import subprocess
from pathlib import Path


class GitError(RuntimeError):
    pass


def _git(root: Path, *args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise GitError(f"git {' '.join(args)} failed in the project root: {proc.stderr.strip()}")
    return proc.stdout


def resolve_base(root: Path, base: str | None) -> str | None:
    """The commit the candidate is compared with: ``base`` if given, else ``HEAD^`` (None for a first commit)."""
    candidate = base or "HEAD^"
    try:
        return _git(root, "rev-parse", "--verify", "--quiet", f"{candidate}^{{commit}}").strip() or None
    except GitError:
        if base:
            raise GitError(f"--ditgate-base {base!r} is not a commit of this repository") from None
        return None


def changed_paths(root: Path, base: str | None) -> list[str]:
    """Paths changed since ``base``: committed, staged, unstaged and untracked (ignored files excluded)."""
    changed: set[str] = set()
    changed.update(_git(root, "diff", "--name-only", base or "HEAD").splitlines())
    changed.update(_git(root, "ls-files", "--others", "--exclude-standard").splitlines())
    return sorted(path for path in changed if path.strip())


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
