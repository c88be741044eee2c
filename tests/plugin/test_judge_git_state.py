"""The judge reads the tree's state from git without trusting what the user can set: flags on the index
(``--skip-worktree``, ``--assume-unchanged``), ``diff.ignoreSubmodules``, symlinks that lead out of the project,
and paths git would quote. Each case is a copy of the baselined synthetic project (``judge_project``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import pytest

from judge_project import Project

EDITED = "def candidate(x):\n    return x  # an edit no commit holds\n"


def flagged(flag: str) -> Callable[[Project, Path], str]:
    def attack(p: Project, tmp_path: Path) -> str:
        assert p.sh("git", "update-index", flag, "candidate/work.py").returncode == 0
        p.write("candidate/work.py", EDITED)
        p.commit("empty: the edit stays out of it")
        return "candidate/work.py"
    attack.__name__ = flag.strip("-").replace("-", "_")
    return attack


def link_outside(p: Project, tmp_path: Path) -> str:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "fast.py").write_text("SPEED = 1\n")
    os.symlink(outside, p.root / "candidate" / "ext")
    p.commit("part of the candidate lives elsewhere")
    (outside / "fast.py").write_text("SPEED = 100\n")
    return "candidate/ext ->"


def dirty_submodule(p: Project, tmp_path: Path) -> str:
    source = tmp_path / "lib"
    source.mkdir()
    (source / "fast.py").write_text("SPEED = 1\n")
    for argv in (("git", "init", "-q"), ("git", "add", "-A"), ("git", "commit", "-qm", "lib")):
        assert Project(source).sh(*argv).returncode == 0
    assert p.sh("git", "clone", "-q", str(source), "candidate/lib").returncode == 0
    added = p.sh("git", "add", "candidate/lib")  # a gitlink (no .gitmodules: that file is outside the mutable paths)
    assert added.returncode == 0, added.stderr
    p.commit("a submodule in the mutable paths")
    assert p.sh("git", "config", "diff.ignoreSubmodules", "all").returncode == 0
    (p.root / "candidate" / "lib" / "fast.py").write_text("SPEED = 100\n")
    return "candidate/lib"


@pytest.mark.slow
@pytest.mark.parametrize("attack", [flagged("--skip-worktree"), flagged("--assume-unchanged"), link_outside,
                                    dirty_submodule], ids=lambda a: a.__name__)
def test_an_edit_git_is_told_to_hide_is_refused(judged: Project, tmp_path: Path, attack) -> None:
    """Before: each was judged (and an empty commit's verdict kept) under a HEAD that lacks the edit."""
    named = attack(judged, tmp_path)
    result = judged.experiment()
    assert result.returncode == 4, result.stdout[-3000:] + result.stderr[-2000:]
    assert "refused" in result.stderr and named in result.stderr
    assert "judged run:" not in result.stdout


def test_a_non_ascii_name_is_read_as_itself(tmp_path: Path) -> None:
    """Before: git quoted ``candidate/ümlaut.py`` (``"candidate/\\303\\274mlaut.py"``), which no mutable path
    matches, so an honest commit of it was judged out of scope (13)."""
    from pytest_ditgate import git
    from pytest_ditgate.verdict.scope import scope_problems

    p = Project(tmp_path)
    p.write("candidate/work.py", "X = 1\n")
    assert p.sh("git", "init", "-q").returncode == 0
    p.commit("base")
    base = git.head(tmp_path)
    p.write("candidate/ümlaut.py", "X = 2\n")
    assert git.changed_since(tmp_path, base) == ["candidate/ümlaut.py"]
    p.commit("a module with a non-ASCII name")
    p.write("candidate/änderung.py", "X = 3\n")
    assert git.changed_since(tmp_path, base) == ["candidate/änderung.py", "candidate/ümlaut.py"]
    assert scope_problems(git.changed_since(tmp_path, base), ["candidate/"], ["golden/"]) == []
