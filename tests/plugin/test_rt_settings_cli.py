"""Red-team round on the ``ditgate`` command: a baseline made where its commit would not be a branch's next commit
(HEAD detached: the commit belongs to no branch and git deletes it in time; a merge, rebase, cherry-pick or revert
half-done: committing would finish it with whatever the tree holds; another git process holding the index) is
refused before anything runs, exit 4 naming the state and what to do, the tree as it was. Arguments given empty
(an unset variable in a script), an option given twice (a script appending to a command line: the last one
won silently) and a non-positive ``summary -n`` are usage errors, not the default."""

from __future__ import annotations

import subprocess
from fnmatch import fnmatch
from pathlib import Path

import pytest

from judge_project import BIN, Project, clean_env, create
from pytest_ditgate import cli


def _state(p: Project) -> dict:
    files = {path.relative_to(p.root).as_posix(): path.read_bytes() for path in sorted(p.root.rglob("*"))
             if path.is_file() and ".git" not in path.parts}
    git = {what: p.sh(*argv).stdout for what, argv in (("head", ("git", "rev-parse", "-q", "--verify", "HEAD")),
                                                         ("refs", ("git", "for-each-ref")))}
    return {"files": files, **git}


def _diverged(p: Project) -> None:
    """Two branches that change the candidate's same line."""
    work = p.root / "candidate" / "work.py"
    p.sh("git", "checkout", "-q", "-b", "side")
    work.write_text(work.read_text() + "SIDE = 1\n")
    p.commit("side")
    p.sh("git", "checkout", "-q", "-")
    work.write_text(work.read_text() + "MAIN = 1\n")
    p.commit("main")


def _detached(p: Project) -> None:
    p.sh("git", "checkout", "-q", "--detach")


def _merging(p: Project) -> None:
    _diverged(p)
    assert p.sh("git", "merge", "side").returncode != 0  # a conflict: the merge waits


def _rebasing(p: Project) -> None:
    _diverged(p)
    assert p.sh("git", "rebase", "side").returncode != 0


def _cherry_picking(p: Project) -> None:
    _diverged(p)
    assert p.sh("git", "cherry-pick", "side").returncode != 0


def _index_held(p: Project) -> None:
    (p.root / ".git" / "index.lock").write_text("")


@pytest.mark.parametrize(("make", "message"), [
    (_detached, "HEAD is detached in *: a commit there belongs to no branch*check out a branch first*"),
    (_merging, "a merge is in progress in *: finish or abandon it first (git merge --continue or git merge --abort)"),
    (_rebasing, "a rebase is in progress in *: finish or abandon it first (git rebase --continue*"),
    (_cherry_picking, "a cherry-pick is in progress in *: finish or abandon it first*"),
    (_index_held, "another git process is using * (*index.lock exists): wait for it to end, or*remove that file"),
])
def test_a_baseline_where_its_commit_would_be_no_branchs_next_writes_nothing(tmp_path: Path, make, message: str) -> None:
    p = create(tmp_path / "project")
    make(p)
    before = _state(p)
    result = p.sh(str(BIN / "ditgate"), "baseline", "--lane", "fwd")
    assert result.returncode == 4, result.stdout[-2000:] + result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr and "judged run:" not in result.stdout, result.stderr
    assert fnmatch(lines[0], "ditgate: cannot record a baseline: " + message), lines[0]
    assert _state(p) == before


def test_a_baseline_on_a_branch_is_not_refused_by_the_check(tmp_path: Path) -> None:
    """The check asks git only: on an ordinary branch, and on a new repository's first branch, it finds nothing."""
    from pytest_ditgate import git

    p = create(tmp_path / "project")
    assert git.branch_problem(p.root) is None
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=fresh, check=True, env=clean_env())
    assert git.branch_problem(fresh) is None


@pytest.mark.parametrize(("argv", "message"), [
    (["summary", "-n", "-3"], "argument -n/--limit: must be at least 1, got -3"),
    (["summary", "-n", "0"], "argument -n/--limit: must be at least 1, got 0"),
    (["summary", "--dir", ""], "argument --dir: is empty (an unset variable in a script?)"),
    (["summary", "--lane", " "], "argument --lane: is empty"),
    (["doctor", "--target", ""], "argument --target: is empty"),
    (["report", "--out", ""], "argument --out: is empty"),
    (["baseline", "--lane", ""], "argument --lane: is empty"),
    (["experiment", "--lane", ""], "argument --lane: is empty"),
    (["baseline", "--lane", "fwd", "--lane", "kernels"], "argument --lane: given twice ('fwd' and 'kernels'); give it once"),
    (["experiment", "--lane", "fwd", "--class", "exact", "--class", "numerical"],
     "argument --class: given twice ('exact' and 'numerical')"),
    (["summary", "-n", "2", "--limit", "3"], "argument --limit: given twice (2 and 3)"),
])
def test_an_empty_repeated_or_nonpositive_argument_is_a_usage_error(pytester: pytest.Pytester, capsys, argv: list[str],
                                                           message: str) -> None:
    pytester.makepyprojecttoml("[tool.pytest.ini_options]\n")
    pytester.chdir()
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 4
    assert message in capsys.readouterr().err
    assert not (pytester.path / ".ditgate").exists()
    assert cli.main(["summary", "-n", "1"]) == 0  # a positive count still reads the (empty) ledger


@pytest.mark.parametrize("where", ["build_parser", "artefact_dir"])
def test_ctrl_c_anywhere_in_the_command_is_one_line_and_130(pytester: pytest.Pytester, monkeypatch, capsys,
                                                            where: str) -> None:
    """Ctrl-C while the command still imported its modules ended in a KeyboardInterrupt traceback (exit -2)."""
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    pytester.makepyprojecttoml("[tool.pytest.ini_options]\n")
    pytester.chdir()
    monkeypatch.setattr(cli, where, interrupted)
    assert cli.main(["summary"]) == 130
    err = capsys.readouterr().err
    assert err == "ditgate: interrupted\n" and not (pytester.path / ".ditgate").exists()


@pytest.mark.parametrize(("body", "message"), [
    ("def (:\n", "which is not valid Python (invalid syntax, line 1): fix it before the judge imports it"),
    ("X = 1\nimport torch\n", "which declares no REGIONS (a list of pytest_ditgate.timed_region.TimedRegion*"),
    ("def REGIONS_for():\n    REGIONS = []\n", "which declares no REGIONS*"),
])
def test_a_baseline_whose_timing_module_cannot_give_regions_writes_nothing(tmp_path: Path, body: str,
                                                                           message: str) -> None:
    """It ran the lane's tests (about 20 s) before the judge imported the module and undid everything."""
    from judge_project import PYPROJECT

    p = create(tmp_path / "project")
    (p.root / "tests" / "gates" / "lane_timing.py").write_text(body)
    (p.root / "pyproject.toml").write_text(PYPROJECT + '\n[tool.ditgate.lanes.timed]\ntests = ["tests/gates/test_gate.py"]\n'
                                           'timing = "tests/gates/lane_timing.py"\n')
    p.commit("a timed lane")
    before = _state(p)
    result = p.sh(str(BIN / "ditgate"), "baseline", "--lane", "fwd")  # any lane: a broken setting is the project's
    assert result.returncode == 4, result.stdout[-2000:] + result.stderr[-2000:]
    assert "judged run:" not in result.stdout and "Traceback" not in result.stderr
    assert fnmatch(result.stderr.strip(), "ditgate: cannot record a baseline: [[]tool.ditgate.lanes.timed[]] timing "
                                          "names 'tests/gates/lane_timing.py', " + message), result.stderr
    assert _state(p) == before


def test_timing_modules_that_bind_regions_pass_the_check(tmp_path: Path) -> None:
    from pytest_ditgate.project_config import timing_module_problem

    for body in ("REGIONS = []\n", "REGIONS: list = []\n", "from lane_regions import REGIONS\n",
                 "from lane_regions import ALL as REGIONS\n", "from lane_regions import *\n"):
        (tmp_path / "t.py").write_text(body)
        assert timing_module_problem(tmp_path, "t.py", "timing") is None, body
    assert timing_module_problem(tmp_path, "missing.py", "timing") is None  # missing_paths reports it
