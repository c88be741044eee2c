"""Fixtures of the judge's tests: one baselined synthetic project per session, copied per test."""

from __future__ import annotations

from pathlib import Path

import pytest

from judge_project import Project, copy, create


@pytest.fixture(scope="session")
def judged_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    project = create(tmp_path_factory.mktemp("judged") / "template")
    done = project.ditgate("baseline", "--lane", "fwd")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return project.root


@pytest.fixture
def judged(judged_template: Path, tmp_path: Path) -> Project:
    """A copy of the baselined project (its git history, lock, goldens and lane history)."""
    return copy(judged_template, tmp_path / "project")
