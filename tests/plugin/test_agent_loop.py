"""Whole experiments in a temporary git repository, driven by the commands of docs/agent_loop.md.

KEEP for a faster exact change, DISCARD (quality)
for a mislabelled quantization, DISCARD (integrity) for an edited fixed path, DISCARD (scope) for an edit
outside the mutable paths; the ledger, the lane history and the report as expected.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from judge_project import BIN, CANDIDATE, REFERENCE, Project, clean_env, create

DOC = Path(__file__).resolve().parents[2] / "docs" / "agent_loop.md"

#: int8 weights held as a plain attribute, dequantized in forward (claims numerical)
QUANTIZED = CANDIDATE.replace('''    def forward(self, x):
        y = x
        for _ in range(self.repeat):
            y = torch.tanh(x)
        return self.proj(y)''', '''    def forward(self, x):
        if not hasattr(self, "qweight"):
            w = self.proj.weight
            self.scale = w.abs().amax(1, keepdim=True) / 127
            self.qweight = (w / self.scale).round().to(torch.int8)
        y = x
        for _ in range(self.repeat):
            y = torch.tanh(x)
        return torch.nn.functional.linear(y, self.qweight.float() * self.scale)''')


def doc_commands() -> list[str]:
    """The commands of the doc's bash blocks (comments and blank lines dropped)."""
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines()
            if line.strip() and not line.strip().startswith("#")]


class DocRepo(Project):
    executed: list[str]

    def run(self, command: str) -> subprocess.CompletedProcess:
        """Run a doc command literally, with .venv/bin/ pointing at this interpreter's bin folder."""
        self.executed.append(command)
        argv = [str(BIN / word[len(".venv/bin/"):]) if word.startswith(".venv/bin/") else word
                for word in shlex.split(command)]
        return subprocess.run(argv, cwd=self.root, capture_output=True, text=True, env=clean_env(), timeout=600)


def experiment_command(cls: str, description: str) -> str:
    template = next(c for c in doc_commands() if c.startswith(".venv/bin/ditgate experiment"))
    command = template.replace("--class exact", f"--class {cls}")
    return re.sub(r'--description "[^"]*"', f'--description "{description}"', command)


def _any_class_and_description(command: str) -> str:
    command = re.sub(r"--class \w+", "--class *", command)
    return re.sub(r'--description "[^"]*"', '--description "*"', command)


@pytest.mark.slow
def test_agent_loop_end_to_end(tmp_path: Path) -> None:
    repo = DocRepo(create(tmp_path).root)
    repo.executed = []
    commands = doc_commands()
    assert repo.run(next(c for c in commands if "ditgate doctor" in c)).returncode == 0
    assert repo.run(next(c for c in commands if c.startswith("git checkout -b"))).returncode == 0
    baseline = repo.run(next(c for c in commands if "ditgate baseline" in c))
    assert baseline.returncode == 0, baseline.stdout[-4000:] + baseline.stderr[-2000:]
    assert repo.sh("git", "status", "--porcelain").stdout == ""  # the baseline committed what it froze
    lane_history = tmp_path / ".ditgate" / "lanes" / "fwd.jsonl"
    first = [json.loads(line) for line in lane_history.read_text().splitlines()]
    assert [r["kind"] for r in first] == ["genesis", "anchor"]
    assert 0.5 < first[1]["best"]["objective"]["ratio"] < 2.0  # the baseline against itself

    commit = next(c for c in commands if c.startswith("git commit -qam"))
    reset = next(c for c in commands if c.startswith("git reset --hard"))

    def attempt(cls: str, description: str) -> subprocess.CompletedProcess:
        assert repo.run(commit).returncode == 0
        result = repo.run(experiment_command(cls, description))
        verdict = repo.verdict()["verdict"]
        assert verdict["exit_code"] == result.returncode, result.stdout[-3000:] + result.stderr[-2000:]
        return result

    # an exact change that is faster: KEEP, and it becomes the lane's best
    repo.candidate(repeat=4)
    kept = attempt("exact", "skip redundant tanh passes")
    assert kept.returncode == 0, kept.stdout[-4000:]
    assert "VERDICT: KEEP" in kept.stdout
    best = json.loads(lane_history.read_text().splitlines()[-1])["best"]
    assert best["objective"]["ratio"] < first[1]["best"]["objective"]["ratio"] * 0.6
    assert best["candidate_config"] == {"repeat": 4}

    # (an empty commit, 11, and the red team: test_judge_runs.py / test_judge_preflight.py)
    # claims numerical but computes with int8 weights: judged as quantization, fails zero-regression quality
    repo.write("candidate/work.py", QUANTIZED.format(repeat=4))
    quant = attempt("numerical", "int8 weights")
    assert quant.returncode == 10, quant.stdout[-4000:]
    assert "declared numerical, judged as quantization" in quant.stdout
    assert repo.run(reset).returncode == 0

    # an edited fixed path: rejected before any test runs, and logged
    repo.write("reference/work.py", REFERENCE.replace("range(24)", "range(48)"))
    fixed = attempt("exact", "slow the reference down")
    assert fixed.returncode == 12, fixed.stdout[-4000:]
    assert repo.run(reset).returncode == 0

    # an edit outside the mutable paths: DISCARD (scope)
    repo.write("notes.txt", "scratch\n")
    repo.run("git add notes.txt")
    scope = attempt("exact", "notes")
    assert scope.returncode == 13, scope.stdout[-4000:]
    assert "notes.txt: outside the mutable paths" in scope.stdout
    assert repo.run(reset).returncode == 0

    assert repo.statuses() == ["keep", "keep", "discard-quality", "discard-integrity", "discard-scope"]
    summary = repo.run(next(c for c in commands if "ditgate summary" in c))
    assert summary.returncode == 0 and "discard-scope" in summary.stdout
    report = repo.run(next(c for c in commands if "ditgate report" in c))
    assert report.returncode == 0
    page = (tmp_path / ".ditgate" / "report.html").read_text()
    assert re.search(r"<img alt='history fwd / [^']+' src='data:image/png;base64,", page)  # the lane's plot

    # every command of the doc ran (bootstrap is what CI itself runs: .ci/run)
    executed = {_any_class_and_description(done) for done in repo.executed}
    for command in commands:
        if not command.startswith("./scripts/bootstrap"):
            assert _any_class_and_description(command) in executed, command
