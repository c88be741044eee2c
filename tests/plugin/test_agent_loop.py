"""Whole experiments in a temporary git repository, driven by the commands of docs/agent_loop.md.

KEEP for a faster exact change, DISCARD (performance) for a slower one, DISCARD (quality) for a
mislabelled quantization, DISCARD (integrity) for an edited fixed path, DISCARD (scope) for an edit
outside the mutable paths; the ledger, the lane best and the report as expected.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "agent_loop.md"
BIN = Path(sys.executable).parent

PYPROJECT = """
[tool.ditgate]
mutable_paths = ["candidate/"]
fixed_paths = ["reference/", "tests/", "fixtures/"]

[tool.pytest.ini_options]
ditgate_bench_budget_ms = "400"
"""

CONTRACT = """
[contract]
version = 1

[metrics.rel_l2]
direction = "lower"
kinds = ["latent", "activation"]
[metrics.rel_l2.exact]
max = 1e-6
[metrics.rel_l2.numerical]
max = 0.05
[metrics.rel_l2.quantization]
max = 1e-4
"""

REFERENCE = """
import torch

def reference(x):
    y = x
    for _ in range(24):
        y = torch.tanh(x)
    return y
"""

CANDIDATE = """
import torch

REPEAT = {repeat}
QUANTIZE = {quantize}

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        if QUANTIZE:
            self.register_buffer("scale_int8", torch.ones(4, dtype=torch.int8))

def build():
    return Model()

def make(repeat, quantize=False):
    def run(x):
        y = x
        for _ in range(repeat):
            y = torch.tanh(x)
        if quantize:
            y = torch.round(y * 64) / 64
        return y
    return run

candidate = make(REPEAT, QUANTIZE)
"""

GATE = """
import torch
from candidate.work import build, candidate
from reference.work import reference


def data():
    return torch.randn(64, 256, generator=torch.Generator().manual_seed(0))


def test_quality(quality_gate, ditgate_candidate):
    ditgate_candidate.declare(build())
    x = data()
    quality_gate.check("case0", {"act": candidate(x)}, {"act": reference(x)}, kinds={"act": "activation"})


def test_speed(ditbench):
    ditbench.pair(candidate, reference, data(), min_speedup=-1e6)  # the lane's best decides, not a fixed threshold


def test_versus_lane_best(ditbench, ditgate_lane):
    import pytest
    from candidate import work
    ditgate_lane.record_config({"repeat": work.REPEAT, "quantize": work.QUANTIZE})
    best = ditgate_lane.best_config
    if best is None:
        pytest.skip("no lane best with a configuration to re-measure yet")
    ditbench.pair(candidate, work.make(best["repeat"], best["quantize"]), data(), min_speedup=-1e6,
                  labels=("candidate", "lane-best"))
"""


def doc_commands() -> list[str]:
    """The commands of the doc's bash blocks (comments and blank lines dropped)."""
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines()
            if line.strip() and not line.strip().startswith("#")]


class Repo:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.executed: list[str] = []

    def write(self, relative: str, text: str) -> None:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def run(self, command: str) -> subprocess.CompletedProcess:
        """Run a doc command literally, with .venv/bin/ pointing at this interpreter's bin folder."""
        self.executed.append(command)
        argv = [str(BIN / word[len(".venv/bin/"):]) if word.startswith(".venv/bin/") else word
                for word in shlex.split(command)]
        env = dict(os.environ)
        env.pop("DITGATE_DEVICE_PROFILE", None)
        env.update(GIT_AUTHOR_NAME="agent", GIT_AUTHOR_EMAIL="agent@example.com", GIT_COMMITTER_NAME="agent",
                   GIT_COMMITTER_EMAIL="agent@example.com", PYTHONDONTWRITEBYTECODE="1")
        return subprocess.run(argv, cwd=self.root, capture_output=True, text=True, env=env, timeout=600)

    def candidate(self, *, repeat: int, quantize: bool = False) -> None:
        self.write("candidate/work.py", CANDIDATE.format(repeat=repeat, quantize=quantize))


def experiment_command(cls: str, description: str) -> str:
    template = next(c for c in doc_commands() if c.startswith(".venv/bin/pytest --ditgate"))
    command = template.replace("--ditgate-class=exact", f"--ditgate-class={cls}")
    return re.sub(r'--ditgate-description="[^"]*"', f'--ditgate-description="{description}"', command)


def _with_any_class_and_description(command: str) -> str:
    command = re.sub(r"--ditgate-class=\w+", "--ditgate-class=*", command)
    return re.sub(r'--ditgate-description="[^"]*"', '--ditgate-description="*"', command)


@pytest.mark.slow
def test_agent_loop_end_to_end(tmp_path: Path) -> None:
    repo = Repo(tmp_path)
    repo.write("pyproject.toml", PYPROJECT)
    repo.write(".gitignore", ".ditgate/\n__pycache__/\n")
    repo.write("fixtures/quality_contract.toml", CONTRACT)
    repo.write("reference/__init__.py", "")
    repo.write("reference/work.py", REFERENCE)
    repo.write("candidate/__init__.py", "")
    repo.candidate(repeat=24)
    repo.write("tests/gates/test_gate.py", GATE)
    repo.write("conftest.py", "")
    for command in ("git init -q", "git add -A", "git commit -qm project"):
        assert repo.run(command).returncode == 0

    commands = doc_commands()
    doctor = next(c for c in commands if "ditgate doctor" in c)
    assert repo.run(doctor).returncode == 0
    assert repo.run(next(c for c in commands if c.startswith("git checkout -b"))).returncode == 0
    baseline = repo.run(next(c for c in commands if "ditgate baseline" in c))
    assert baseline.returncode == 0, baseline.stdout + baseline.stderr
    for command in ("git add -A", 'git commit -qm "freeze the baseline"'):
        assert command in commands
        assert repo.run(command).returncode == 0
    ledger = tmp_path / ".ditgate"
    best_files = list((ledger / "best").glob("fwd__*.json"))
    assert len(best_files) == 1
    first_best = json.loads(best_files[0].read_text())["objective"]["ratio"]
    assert 0.7 < first_best < 1.4  # the baseline against itself

    commit = next(c for c in commands if c.startswith("git commit -qam"))
    reset = next(c for c in commands if c.startswith("git reset --hard"))

    def attempt(cls: str, description: str) -> subprocess.CompletedProcess:
        assert repo.run(commit).returncode == 0
        result = repo.run(experiment_command(cls, description))
        verdict = json.loads((ledger / "verdict.json").read_text())["verdict"]
        assert verdict["exit_code"] == result.returncode, result.stdout[-3000:]
        return result

    # an exact change that is faster: KEEP, and it becomes the lane's best
    repo.candidate(repeat=4)
    kept = attempt("exact", "skip redundant tanh passes")
    assert kept.returncode == 0, kept.stdout[-4000:]
    assert "VERDICT: KEEP" in kept.stdout
    best = json.loads(best_files[0].read_text())
    assert best["objective"]["ratio"] < first_best * 0.6
    assert best["comparisons"] and best["comparisons"][0]["comparison"]["a"]["samples_ms"]
    assert best["candidate_config"] == {"repeat": 4, "quantize": False}
    assert "re-measured lane best" in kept.stdout  # judged against the best measured in the same run

    # slower again: DISCARD (performance), reset to the best
    repo.candidate(repeat=24)
    slower = attempt("exact", "redo the passes")
    assert slower.returncode == 11, slower.stdout[-4000:]
    assert "not faster than the lane best: candidate / re-measured lane best" in slower.stdout
    assert repo.run(reset).returncode == 0

    # claims numerical but holds int8 weights: judged as quantization, fails zero-regression quality
    repo.candidate(repeat=4, quantize=True)
    quant = attempt("numerical", "int8 scales")
    assert quant.returncode == 10, quant.stdout[-4000:]
    assert "declared numerical, judged as quantization" in quant.stdout
    assert repo.run(reset).returncode == 0

    # an edited fixed path: rejected before any test runs, and logged
    repo.write("reference/work.py", REFERENCE.replace("range(24)", "range(2)"))
    fixed = attempt("exact", "make the reference slow down less")
    assert fixed.returncode == 12, fixed.stdout[-4000:]
    assert repo.run(reset).returncode == 0

    # an edit outside the mutable paths: DISCARD (scope)
    repo.candidate(repeat=4)
    repo.write("notes.txt", "scratch\n")
    repo.run("git add notes.txt")
    scope = attempt("exact", "notes")
    assert scope.returncode == 13, scope.stdout[-4000:]
    assert "notes.txt: outside the mutable paths" in scope.stdout
    assert repo.run(reset).returncode == 0

    rows = [line.split("\t") for line in (ledger / "results.tsv").read_text().splitlines()]
    header, rows = rows[0], rows[1:]
    statuses = [dict(zip(header, row))["status"] for row in rows]
    assert statuses == ["keep", "keep", "discard-performance", "discard-quality", "discard-integrity",
                        "discard-scope"]
    assert json.loads(best_files[0].read_text())["objective"]["ratio"] == best["objective"]["ratio"]

    summary = repo.run(next(c for c in commands if "ditgate summary" in c))
    assert summary.returncode == 0 and "discard-scope" in summary.stdout
    report = repo.run(next(c for c in commands if "ditgate report" in c))
    assert report.returncode == 0
    page = (ledger / "report.html").read_text()
    assert re.search(r"<img alt='history fwd / [^']+' src='data:image/png;base64,", page)  # the lane's plot

    # every command of the doc ran (bootstrap is what CI itself runs: .ci/run); the experiment command
    # ran with each attempt's class and description
    executed = {_with_any_class_and_description(done) for done in repo.executed}
    for command in commands:
        if not command.startswith("./scripts/bootstrap"):
            assert _with_any_class_and_description(command) in executed, command
