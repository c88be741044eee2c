"""A lane's history lives in the worktree that recorded its baseline; its refs are shared by every worktree of
the repository. An experiment in a linked worktree (``git worktree add``) finds the refs but not the history:
it is told to run in the main worktree, not that the history is lost."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pytest_ditgate import git
from pytest_ditgate.experiment.history import HistoryError, read_history, ref_name


def sh(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    sh(root, "init", "-q")
    sh(root, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "--allow-empty", "-m", "start")
    git.write_blob_ref(root, ref_name("fwd"), '{"seq": 3}')  # the tip ref a baseline and two experiments leave
    return root


def test_an_experiment_in_a_linked_worktree_is_sent_to_the_main_one(repository: Path) -> None:
    linked = repository.parent / "linked"
    sh(repository, "worktree", "add", "-q", "--detach", str(linked))
    with pytest.raises(HistoryError) as caught:
        read_history(linked, linked / ".ditgate", "fwd", genesis_hash="g")
    message = str(caught.value)
    assert "this is a linked git worktree" in message and "run ditgate experiment in the main worktree" in message
    assert str(repository.resolve()) in message and "restore it" not in message
    assert git.main_worktree(linked).resolve() == repository.resolve() and git.main_worktree(repository) is None


def test_a_history_missing_from_the_main_worktree_is_still_lost(repository: Path) -> None:
    with pytest.raises(HistoryError, match="is missing .the tip ref names record 3.; restore it"):
        read_history(repository, repository / ".ditgate", "fwd", genesis_hash="g")
