"""Fixtures of the plugin's tests: one baselined synthetic project per session (shared by the xdist workers),
copied per test; Ctrl-C as a terminal delivers it."""

from __future__ import annotations

import os
import signal
import threading
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


@pytest.fixture
def ctrl_c_delivered():
    """SIGINT raises KeyboardInterrupt in this process and in the processes the test starts, as at a terminal.
    A shell's background job starts with SIGINT ignored, which every process inherits: a test of Ctrl-C
    would then see nothing happen."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("only the main thread may set a signal handler")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
