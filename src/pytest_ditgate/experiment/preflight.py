"""What must hold before the judge writes anything: the preconditions of ``ditgate baseline`` and the clean
tree ``ditgate experiment`` judges.

A baseline that fails half-way is undone (``transaction.py``), but one that cannot succeed is refused before
it starts: outside a git working tree, or where git does not know who commits, it would run the lane's tests
for minutes and then fail at the commit. An experiment judges a commit: an uncommitted edit would be judged
and recorded under a HEAD that lacks it, a best nobody can reproduce.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping


def baseline_problems(root: Path, project: Mapping[str, Any], lane_tests: tuple[str, ...], artefacts: Path,
                      history_file: Path, golden_store: Path) -> list[str]:
    """Why ``ditgate baseline`` cannot run here (empty when it can); reads only. A mutable path that does not
    exist at the baseline is a typo: every later edit would be out of scope (13)."""
    from pytest_ditgate import git
    from pytest_ditgate.golden.fixed_paths import LockSettings, unlocated_fixed_paths
    from pytest_ditgate.project_config import missing_folder_problem, missing_paths, string_list

    problems = [p for p in (git.work_tree_problem(root),) if p]
    if not problems:
        problems += [p for p in (git.identity_problem(root),) if p]
    if history_file.exists():
        problems.append(f"the lane history {history_file} exists, but no baseline of the lane is recorded (neither "
                        "the fixed-paths lock nor the lane's git ref names it): move it away before a new baseline")
    problems += unlocated_fixed_paths(LockSettings.from_rootdir(root), golden_store)
    problems += missing_paths(root, string_list(project, "mutable_paths"), "[tool.ditgate] mutable_paths")
    problems += missing_paths(root, list(lane_tests), "the lane's tests")
    folder = missing_folder_problem(artefacts, root)
    if folder:
        problems.append(f"the artefact folder: {folder}")
    return problems


def uncommitted_changes(root: Path, artefacts: Path, mutable: list[str]) -> list[str]:
    """The paths an experiment would judge although HEAD lacks them: every staged, unstaged or untracked change,
    and every file git ignores inside the mutable paths (a prebuilt library, a module a committed
    ``.gitignore`` hides: the candidate's code could load them); the artefact folder, ``__pycache__`` folders
    and bytecode aside (the judge reads neither, and compiles every module from source)."""
    from pytest_ditgate import git

    try:
        skip = artefacts.resolve().relative_to(root.resolve()).as_posix() + "/"
    except ValueError:
        skip = None
    paths = git.uncommitted(root) + git.ignored(root, list(mutable))
    return sorted({path for path in paths
                   if not (skip and (path.rstrip("/") + "/").startswith(skip))
                   and "__pycache__" not in path.split("/") and not path.endswith((".pyc", ".pyo"))})
