"""The lane's history and the git refs that pin it change together, and what they name stays reachable: a
tip ref that cannot move leaves no record behind, and a detached HEAD is refused (each case a copy of the
baselined synthetic project; ``judge_project``)."""

from __future__ import annotations

import json

import pytest

from judge_project import Project

REF = "refs/ditgate/lanes/fwd"


def history_text(p: Project) -> str:
    return (p.root / ".ditgate" / "lanes" / "fwd.jsonl").read_text()


def stale_ref_lock(p: Project):
    lock = p.root / ".git" / "refs" / "ditgate" / "lanes" / "fwd.lock"
    lock.write_text("")
    return lock


def test_a_record_whose_tip_ref_cannot_move_is_rolled_back(judged: Project) -> None:
    """Before: the record stayed in the history while the ref named the one before it, and every later
    experiment was 12 ("ends at record 2, but the tip ref names record 1")."""
    from pytest_ditgate.experiment import history

    from pytest_ditgate.golden.fixed_paths import LockSettings, read_lock

    before = history_text(judged)

    genesis = read_lock(LockSettings.from_rootdir(judged.root))["lanes"]["fwd"]["genesis"]
    lane = history.read_history(judged.root, judged.root / ".ditgate", "fwd", genesis_hash=genesis)
    record = history.seal("fwd", {"kind": "experiment", "label": "discard-performance"}, lane.tip)
    lock = stale_ref_lock(judged)
    with pytest.raises(history.HistoryError, match="fwd.lock exists.*remove that file.*not kept"):
        history.append(judged.root, lane.path, record)
    assert history_text(judged) == before
    lock.unlink()
    again = history.read_history(judged.root, judged.root / ".ditgate", "fwd", genesis_hash=genesis)
    assert again.tip == lane.tip
    history.append(judged.root, lane.path, record)  # the lane goes on
    assert history.read_history(judged.root, judged.root / ".ditgate", "fwd", genesis_hash=genesis).tip == record


@pytest.mark.slow
def test_a_stale_ref_lock_is_refused_before_the_run(judged: Project) -> None:
    """Before: the run went ahead and ended CRASH 15 with the record appended, the ledger saying crash."""
    before = history_text(judged)
    tip = judged.sh("git", "cat-file", "blob", REF).stdout
    stale_ref_lock(judged)
    judged.commit("empty")
    result = judged.experiment()
    assert result.returncode == 4, result.stdout[-3000:] + result.stderr[-2000:]
    assert "fwd.lock exists" in result.stderr and "remove that file" in result.stderr
    assert "judged run:" not in result.stdout
    assert history_text(judged) == before and judged.sh("git", "cat-file", "blob", REF).stdout == tip
    assert json.loads(tip)["seq"] == len(before.splitlines()) - 1


BEST = "refs/ditgate/best/fwd"


@pytest.mark.slow
def test_an_experiment_on_a_detached_head_is_refused(judged: Project) -> None:
    """Before: it was judged, and a KEEP there was a commit of no branch: once the branch moved and git
    collected its garbage, the lane was 12 for ever ("cannot diff against the best's commit")."""
    before = history_text(judged)
    judged.commit("empty")
    assert judged.sh("git", "checkout", "-q", "--detach").returncode == 0
    result = judged.experiment()
    assert result.returncode == 4, result.stdout[-3000:] + result.stderr[-2000:]
    assert "HEAD is detached" in result.stderr and "check out a branch first" in result.stderr
    assert history_text(judged) == before


@pytest.mark.slow
def test_the_lane_best_is_pinned_so_gc_keeps_it(judged: Project) -> None:
    """The baseline pins its commit as the lane's first best; a lane recorded without the pin gets it at its
    next record; a best off every branch survives ``git gc``."""
    from pytest_ditgate import git

    anchor = json.loads(history_text(judged).splitlines()[-1])["best"]["commit"]
    assert git.rev(judged.root, BEST) == anchor
    assert judged.sh("git", "update-ref", "-d", BEST).returncode == 0
    judged.write("notes.txt", "scratch\n")
    judged.commit("notes")
    assert judged.experiment().returncode == 13  # recorded before any child runs
    assert git.rev(judged.root, BEST) == anchor
    from pytest_ditgate.experiment.history import pin_best

    pin_best(judged.root, "fwd", "0" * 12)  # a best git no longer has: left to the scope check's 12
    pin_best(judged.root, "fwd", anchor[:12])  # a KEEP record names its commit short
    assert git.rev(judged.root, BEST) == anchor
    assert judged.sh("git", "checkout", "-q", "--orphan", "elsewhere").returncode == 0
    judged.commit("a branch that shares nothing with the lane")
    assert judged.sh("git", "branch", "-D", "master").returncode == 0 or \
        judged.sh("git", "branch", "-D", "main").returncode == 0
    for argv in (("git", "reflog", "expire", "--expire=now", "--all"), ("git", "gc", "-q", "--prune=now")):
        assert judged.sh(*argv).returncode == 0
    assert judged.sh("git", "cat-file", "-e", f"{anchor}^{{commit}}").returncode == 0


LANE_TWO = """[tool.ditgate.lanes.two]
tests = ["tests/gates/test_two.py"]
class = "exact"
required = ["*test_quality*"]

"""


@pytest.mark.slow
def test_another_lanes_baseline_is_no_change_of_this_lane(judged: Project) -> None:
    """Before: the second lane's baseline commit (its goldens, the manifest, the lock, its lane's settings)
    counted as fixed-path changes since the first lane's anchors, and the first lane was 12 for ever. Only
    what that recorded baseline commit itself changed is the maintainer's: a change before it still counts."""
    from judge_project import GATE

    judged.write("notes.txt", "scratch\n")
    judged.commit("notes, before the second lane's baseline")
    pyproject = (judged.root / "pyproject.toml").read_text()
    judged.write("pyproject.toml", pyproject.replace("[tool.pytest.ini_options]",
                                                     LANE_TWO + "[tool.pytest.ini_options]"))
    judged.write("tests/gates/test_two.py", GATE.replace('"case0"', '"two0"'))
    done = judged.ditgate("baseline", "--lane", "two")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    changed = judged.sh("git", "show", "--name-only", "--format=", "HEAD").stdout.split()
    assert "golden/fixed_paths.lock.json" in changed and "pyproject.toml" in changed

    counted = judged.experiment()
    assert counted.returncode == 13, counted.stdout[-3000:] + counted.stderr[-2000:]
    assert "notes.txt: outside the mutable paths" in counted.stdout
    assert "golden/" not in counted.stdout and "pyproject.toml" not in counted.stdout

    assert judged.sh("git", "rm", "-q", "notes.txt").returncode == 0
    judged.commit("no notes")
    result = judged.experiment()
    assert result.returncode in (0, 11), result.stdout[-3000:] + result.stderr[-2000:]
    assert "changed since the lane's anchors" not in result.stdout
