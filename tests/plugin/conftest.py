"""Fixtures of the judge's tests: one baselined synthetic project per session (shared by the xdist
workers), copied per test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from judge_project import Project, copy, shared_template


@pytest.fixture(scope="session")
def judged_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # pytest-<n>/ of this run, shared by its workers (popen-gw0, popen-gw1, ...)
    return shared_template(base)


@pytest.fixture
def judged(judged_template: Path, tmp_path: Path) -> Project:
    """A copy of the baselined project (its git history, lock, goldens and lane history)."""
    return copy(judged_template, tmp_path / "project")
