"""A small synthetic project judged by ``ditgate experiment`` in a temporary git repository (CPU, tiny ops).

One template per test session (shared by the xdist workers) is set up and baselined once with the
commands of docs/agent_loop.md (:func:`build_template`); each test copies it (with its ``.git`` and
``.ditgate``), commits its change, and runs the judge exactly as the doc says.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest_ditgate

BIN = Path(sys.executable).parent
#: the plugin under test, importable in the project's processes (a folder outside the project)
PLUGIN_SRC = str(Path(pytest_ditgate.__file__).resolve().parents[1])

PYPROJECT = """
[tool.ditgate]
mutable_paths = ["candidate/"]
fixed_paths = ["reference/", "fixtures/"]

[tool.ditgate.lanes.fwd]
tests = ["tests/gates/test_gate.py"]
class = "exact"
required = ["*test_quality*", "*test_speed*"]

[tool.pytest.ini_options]
ditgate_bench_budget_ms = "150"
# the project has no hypothesis tests: its pytest plugin would cost every judged run 1.4 s of imports
addopts = "-p no:hypothesispytest"
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
[metrics.rel_l2.approximate]
max = 0.05
[metrics.rel_l2.quantization]
max = 1e-4
"""

REFERENCE = """
import torch

W = torch.randn(256, 256, generator=torch.Generator().manual_seed(1)) / 16
#: how many times each tanh pass runs (a timed project sets it for its host: ``removable_work_scale``)
SCALE = 1


def reference(x):
    y = x
    for _ in range(24):
        for _ in range(SCALE):
            y = torch.tanh(x)
    return y @ W
"""

CANDIDATE = """
import torch
from reference.work import SCALE, W

REPEAT = {repeat}


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(256, 256, bias=False)
        with torch.no_grad():
            self.proj.weight.copy_(W.t())

    def forward(self, x):
        y = x
        for _ in range(self.repeat * SCALE):
            y = torch.tanh(x)
        return self.proj(y)

    repeat = REPEAT


MODEL = Model()


def make(repeat):
    model = Model()
    model.repeat = repeat
    return model


def build():
    return MODEL


def candidate(x):
    with torch.no_grad():
        return MODEL(x)
"""

def serving(model: str) -> str:
    """The end of a candidate module that replaces the template's model with its own class ``model``: one
    instance, which ``build`` returns and ``candidate`` calls without autograd."""
    return f'''

MODEL = {model}()


def build():  # noqa: F811
    return MODEL


def candidate(x):  # noqa: F811
    with torch.no_grad():
        return MODEL(x)
'''


GATE = """
import torch
from candidate import work
from candidate.work import build, candidate
from reference.work import reference


def data():
    return torch.randn(64, 256, generator=torch.Generator().manual_seed(0))


def test_quality(golden, quality_gate, ditgate_candidate):
    ditgate_candidate.declare(build())

    def compare(cand, hit):
        return quality_gate.check("case0", cand, hit.tensors, tolerance_scale=hit.tolerance_scale)

    golden.check("case0", {"act": candidate(data())}, compare=compare)


def test_speed(ditbench):
    ditbench.pair(candidate, reference, data(), min_speedup=None)


def test_versus_lane_best(ditbench, ditgate_lane):
    import pytest
    ditgate_lane.record_config({"repeat": work.REPEAT})
    best = ditgate_lane.best_config
    if best is None:
        pytest.skip("no lane best with a configuration to re-measure yet")
    other = work.make(best["repeat"])
    def rebuilt(x):
        with torch.no_grad():
            return other(x)
    ditbench.pair(candidate, rebuilt, data(), min_speedup=None, labels=("candidate", "lane-best"))
"""


#: the lane of a project the judge times itself (``timing``): its regions, a fixed file of the project
#: a lane over a softmax kernel: no GEMM, no nn.Module, a candidate about 13x faster than its reference, and no
#: test that re-measures the best (each candidate's ratio is compared with the best's recorded one)
SOFTMAX_REFERENCE = """
import torch


def reference(x):
    for _ in range(8):
        y = torch.exp(x - x.amax(-1, keepdim=True))
    return y / y.sum(-1, keepdim=True)
"""

SOFTMAX_CANDIDATE = """
import torch


def candidate(x):
    return torch.softmax(x, dim=-1)
"""

SOFTMAX_GATE = """
import torch
from candidate.work import candidate
from reference.work import reference


def data():
    return torch.randn(64, 256, generator=torch.Generator().manual_seed(0))


def test_quality(golden, quality_gate):
    def compare(cand, hit):
        return quality_gate.check("case0", cand, hit.tensors, tolerance_scale=hit.tolerance_scale)

    golden.check("case0", {"act": candidate(data())}, compare=compare)


def test_speed(ditbench):
    ditbench.pair(candidate, reference, data(), min_speedup=None)
"""


TIMED_LANE = """
[tool.ditgate.lanes.timed]
tests = ["tests/gates/test_gate.py"]
class = "exact"
required = ["*test_quality*", "*test_speed*"]
timing = "tests/gates/lane_timing.py"
"""

LANE_TIMING = """
from pytest_ditgate.timed_region import TimedRegion


def build(impl):
    if impl == "candidate":
        from candidate.work import candidate
        return candidate
    from reference.work import reference
    return reference


def make_inputs(generator):
    import torch
    return (torch.randn(256, 256, generator=generator),)


REGIONS = [TimedRegion("forward", build, make_inputs, device="cpu", rounds=16, max_rounds=32, audits=3,
                       audit_rel_l2=1e-4, calls=4)]
"""


def clean_env(**extra: str) -> dict[str, str]:
    """The judge's environment: no ditgate or pytest switches, the plugin's source on ``PYTHONPATH``. The GPU
    check's read recorder stays on it (after whatever ``extra`` names), so that what the judge and its
    children read is known (scripts/read_recorder/)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DITGATE_", "PYTEST_", "PYTHONPATH"))}
    env.update(GIT_AUTHOR_NAME="agent", GIT_AUTHOR_EMAIL="agent@example.com", GIT_COMMITTER_NAME="agent",
               GIT_COMMITTER_EMAIL="agent@example.com", PYTHONPATH=PLUGIN_SRC)
    env.update(extra)
    recorder = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                if entry and (Path(entry) / "gpucheck_recorder.py").is_file()]
    env["PYTHONPATH"] = os.pathsep.join([*env["PYTHONPATH"].split(os.pathsep), *recorder])
    return env


class Project:
    def __init__(self, root: Path) -> None:
        self.root = root

    def write(self, relative: str, text: str) -> None:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def sh(self, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), cwd=self.root, capture_output=True, text=True, env=env or clean_env(),
                              timeout=600)

    def ditgate(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        return self.sh(str(BIN / "ditgate"), *args, env=clean_env(**env))

    def experiment(self, cls: str = "exact", description: str = "try", **env: str) -> subprocess.CompletedProcess:
        return self.ditgate("experiment", "--lane", "fwd", f"--class={cls}", f"--description={description}", **env)

    def commit(self, message: str = "candidate") -> None:
        assert self.sh("git", "add", "-A").returncode == 0
        done = self.sh("git", "commit", "-qm", message, "--allow-empty")
        assert done.returncode == 0, done.stderr

    def candidate(self, repeat: int, body: str = CANDIDATE) -> None:
        self.write("candidate/work.py", body.format(repeat=repeat))

    def verdict(self) -> dict:
        return json.loads((self.root / ".ditgate" / "verdict.json").read_text())

    def statuses(self) -> list[str]:
        lines = (self.root / ".ditgate" / "results.tsv").read_text().splitlines()
        header = lines[0].split("\t")
        return [dict(zip(header, line.split("\t")))["status"] for line in lines[1:]]


#: what the baseline's removable work (its 24 tanh passes, 18 of which an honest candidate drops) costs a call of
#: a timed project at least: more than the judge's round trip per call, which reached 1.8 ms on a GPU host's CPU
#: under 12 xdist workers, where 24 passes took about 0.5 ms and an honest 4x cut read 0.87-0.93
REMOVABLE_WORK_MS = 4.0


def removable_work_scale(most: int = 8) -> int:
    """How many times a timed project runs each tanh pass on this host, so that 24 passes cost a call about
    ``REMOVABLE_WORK_MS`` (1 on a two-core CI machine, where they take about 4 ms; more on a fast host). The
    output does not change (tanh(x) is recomputed from x each time)."""
    import time

    import torch

    x = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
    torch.tanh(x)
    took = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(24):
            torch.tanh(x)
        took.append((time.perf_counter() - start) * 1e3)
    return max(1, min(most, round(REMOVABLE_WORK_MS / max(min(took), 1e-3))))


def create(root: Path, *, pyproject: str = PYPROJECT, contract: str = CONTRACT, gate: str = GATE,
           timed: bool = False) -> Project:
    """The project, committed, not yet baselined (another ``pyproject``, ``contract`` or ``gate`` text where a
    test needs one; ``timed``: with the lane ``timed``, which the judge times, its removable work scaled to this
    host)."""
    project = Project(root)
    project.write("pyproject.toml", pyproject.replace("[tool.pytest.ini_options]", TIMED_LANE.strip() +
                                                      "\n\n[tool.pytest.ini_options]") if timed else pyproject)
    if timed:
        project.write("tests/gates/lane_timing.py", LANE_TIMING)
    project.write(".gitignore", ".ditgate/\n__pycache__/\n")
    project.write("fixtures/quality_contract.toml", contract)
    project.write("reference/__init__.py", "")
    project.write("reference/work.py", REFERENCE.replace("SCALE = 1", f"SCALE = {removable_work_scale()}")
                  if timed else REFERENCE)
    project.write("candidate/__init__.py", "")
    project.candidate(repeat=24)
    project.write("tests/gates/test_gate.py", gate)
    project.write("conftest.py", "")
    assert project.sh("git", "init", "-q").returncode == 0
    project.commit("project")
    return project


def copy(template: Path, root: Path) -> Project:
    shutil.copytree(template, root, symlinks=True)
    return Project(root)


DOC = Path(__file__).resolve().parents[2] / "docs" / "agent_loop.md"


def doc_commands() -> list[str]:
    """The commands of docs/agent_loop.md's bash blocks (comments and blank lines dropped)."""
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines()
            if line.strip() and not line.strip().startswith("#")]


class DocRepo(Project):
    """A project driven by the doc's commands, run literally (``.venv/bin/`` is this interpreter's bin)."""

    def __init__(self, root: Path, executed: list[str] | None = None) -> None:
        super().__init__(root)
        self.executed = [] if executed is None else executed

    def run(self, command: str) -> subprocess.CompletedProcess:
        self.executed.append(command)
        argv = [str(BIN / word[len(".venv/bin/"):]) if word.startswith(".venv/bin/") else word
                for word in shlex.split(command)]
        return subprocess.run(argv, cwd=self.root, capture_output=True, text=True, env=clean_env(), timeout=600)


#: the doc's set-up commands the template runs (bootstrap is what CI itself runs first: .ci/run)
SETUP = ("git checkout -b", "ditgate baseline")


def build_template(root: Path) -> DocRepo:
    """The project, set up once as docs/agent_loop.md says: a branch, ``ditgate baseline`` (the agent loop
    test runs the doc's other commands).
    The commands it ran are kept in ``<root>.executed.json`` (outside the repository)."""
    repo = DocRepo(create(root).root)
    commands = doc_commands()
    for step in SETUP:
        command = next(c for c in commands if step in c)
        done = repo.run(command)
        assert done.returncode == 0, f"{command}:\n{done.stdout[-4000:]}{done.stderr[-4000:]}"
    assert repo.sh("git", "status", "--porcelain").stdout == ""  # the baseline committed what it froze
    root.with_suffix(".executed.json").write_text(json.dumps(repo.executed))
    return repo


def shared_template(base: Path) -> Path:
    """The session's template under ``base`` (a folder all xdist workers share), built by the first
    worker that asks; the others wait on a file lock and reuse it."""
    from filelock import FileLock

    root = base / "judged-template"
    with FileLock(str(base / "judged-template.lock")):
        if not root.with_suffix(".executed.json").exists():
            if root.exists():
                shutil.rmtree(root)  # a half-built template of a worker that died
            build_template(root)
    return root
