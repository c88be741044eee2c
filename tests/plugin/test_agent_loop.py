"""Whole experiments in a temporary git repository, driven by the commands of docs/agent_loop.md.

The session's template ran the doc's set-up (doctor, a branch, ``ditgate baseline``); this test continues
on a copy: KEEP for an honest faster exact change (with a harmless uint8 mask), DISCARD (performance) for
an empty commit, DISCARD (integrity) for an edited fixed path, DISCARD (scope) for an edit outside the
mutable paths; the ledger, the lane history and the report as expected (a mislabelled quantization,
DISCARD (quality), is in test_judge_runs.py).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from judge_project import CANDIDATE, REFERENCE, DocRepo, copy, doc_commands

#: an honest speedup that also carries a 0/1 uint8 mask buffer (a mask is not quantization)
UINT8_MASK = CANDIDATE.replace("        self.proj = torch.nn.Linear(256, 256, bias=False)", """        self.proj = torch.nn.Linear(256, 256, bias=False)
        self.register_buffer("keep", (torch.arange(64 * 64).reshape(64, 64) % 3 == 0).to(torch.uint8))""")


def experiment_command(cls: str, description: str) -> str:
    template = next(c for c in doc_commands() if c.startswith(".venv/bin/ditgate experiment"))
    command = template.replace("--class exact", f"--class {cls}")
    return re.sub(r'--description "[^"]*"', f'--description "{description}"', command)


def _any_class_and_description(command: str) -> str:
    command = re.sub(r"--class \w+", "--class *", command)
    return re.sub(r'--description "[^"]*"', '--description "*"', command)


@pytest.mark.slow
def test_agent_loop_end_to_end(judged_template: Path, tmp_path: Path) -> None:
    executed = json.loads(judged_template.with_suffix(".executed.json").read_text())
    repo = DocRepo(copy(judged_template, tmp_path / "project").root, executed)
    commands = doc_commands()
    doctor = repo.run(next(c for c in commands if "ditgate doctor" in c))
    assert doctor.returncode == 0, doctor.stdout[-2000:] + doctor.stderr[-2000:]
    lane_history = repo.root / ".ditgate" / "lanes" / "fwd.jsonl"
    first = [json.loads(line) for line in lane_history.read_text().splitlines()]
    assert [r["kind"] for r in first] == ["genesis", "anchor"]
    assert 0.5 < first[1]["best"]["objective"]["ratio"] < 2.0  # the baseline against itself

    commit = next(c for c in commands if c.startswith("git commit -qam"))
    reset = next(c for c in commands if c.startswith("git reset --hard"))

    def judge(cls: str, description: str) -> subprocess.CompletedProcess:
        result = repo.run(experiment_command(cls, description))
        verdict = repo.verdict()["verdict"]
        assert verdict["exit_code"] == result.returncode, result.stdout[-3000:] + result.stderr[-2000:]
        return result

    def attempt(cls: str, description: str) -> subprocess.CompletedProcess:
        assert repo.run(commit).returncode == 0
        return judge(cls, description)

    # an exact change that is faster (and carries a 0/1 uint8 mask): KEEP, and it becomes the lane's best
    repo.write("candidate/work.py", UINT8_MASK.format(repeat=4))
    kept = attempt("exact", "skip redundant tanh passes")
    assert kept.returncode == 0, kept.stdout[-4000:]
    assert "VERDICT: KEEP" in kept.stdout
    assert repo.verdict()["classification"]["effective"] == "exact", repo.verdict()["classification"]
    best = json.loads(lane_history.read_text().splitlines()[-1])["best"]
    assert best["objective"]["ratio"] < first[1]["best"]["objective"]["ratio"] * 0.6
    assert best["candidate_config"] == {"repeat": 4}
    from pytest_ditgate.device import real_device
    from pytest_ditgate.verdict.ledger import load_best

    mirrored = load_best(repo.root / ".ditgate", "fwd", real_device().arch)  # what advisory runs compare with
    assert mirrored is not None and mirrored["objective"] == best["objective"]

    # an empty commit is not faster than the best it equals: DISCARD (performance)
    repo.commit("nothing")
    empty = judge("exact", "nothing")
    assert empty.returncode == 11, empty.stdout[-4000:]
    assert "not faster than the lane best" in empty.stdout
    assert repo.run(reset).returncode == 0

    # an edited fixed path: rejected before any test runs, and logged
    repo.write("reference/work.py", REFERENCE.replace("range(24)", "range(48)"))
    fixed = attempt("exact", "slow the reference down")
    assert fixed.returncode == 12, fixed.stdout[-4000:]
    assert "reference/work.py" in fixed.stdout and "judged run:" not in fixed.stdout
    assert repo.run(reset).returncode == 0

    # an edit outside the mutable paths: DISCARD (scope)
    repo.write("notes.txt", "scratch\n")
    repo.run("git add notes.txt")
    scope = attempt("exact", "notes")
    assert scope.returncode == 13, scope.stdout[-4000:]
    assert "notes.txt: outside the mutable paths" in scope.stdout
    assert repo.run(reset).returncode == 0

    assert repo.statuses() == ["keep", "keep", "discard-performance", "discard-integrity", "discard-scope"]
    summary = repo.run(next(c for c in commands if "ditgate summary" in c))
    assert summary.returncode == 0 and "discard-scope" in summary.stdout
    report = repo.run(next(c for c in commands if "ditgate report" in c))
    assert report.returncode == 0
    page = (repo.root / ".ditgate" / "report.html").read_text()
    assert re.search(r"<img alt='history fwd / [^']+' src='data:image/png;base64,", page)  # the lane's plot

    # every command of the doc ran (bootstrap is what CI itself runs: .ci/run)
    done = {_any_class_and_description(command) for command in repo.executed}
    for command in commands:
        if not command.startswith("./scripts/bootstrap"):
            assert _any_class_and_description(command) in done, command
