"""The judge's audits follow the class it judges (issue 49 on issue 46's timing): a quantized or approximate
candidate's timed outputs differ from the baseline's by design, so a region's ``audit_by_class`` names another
bound for such a class, or ``None``: each implementation's audited rounds are then recomputed by a fresh, untimed
process of its own tree from the same seeds, and must match.

A synthetic project (tests/plugin/judge_project.py) whose lane ``timed`` declares ``audit_by_class =
{"quantization": None}``, baselined once per session. An honest int8-weight candidate KEEPs there; the same
candidate on a lane without the rule is 12 (its outputs are not the baseline's to 1e-4); a quantized candidate
that replays one answer for every input, or skips every other call, is still 12: a fresh process does not
reproduce it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from judge_project import CANDIDATE, CONTRACT, LANE_TIMING, Project, copy, create, serving

pytestmark = pytest.mark.slow

#: quantization is judged by the contract at int8's error, not at the toy contract's 1e-4
CLASSED_CONTRACT = CONTRACT.replace("[metrics.rel_l2.quantization]\nmax = 1e-4", "[metrics.rel_l2.quantization]\nmax = 0.05")
CLASSED_TIMING = LANE_TIMING.replace('audit_rel_l2=1e-4, calls=4)',
                                     'audit_rel_l2=1e-4, calls=4,\n'
                                     '                       audit_by_class={"quantization": None})')

#: int8 weights with a per-row scale (a quantized module the judge's observer finds), a quarter of the tanh calls
QUANTIZED = CANDIDATE.format(repeat=6) + '''

class Int8Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        weight = W.t().contiguous()
        scale = weight.abs().amax(dim=1, keepdim=True) / 127
        self.register_buffer("qweight", torch.round(weight / scale).to(torch.int8))
        self.register_buffer("scale", scale)

    def forward(self, x):
        y = x
        for _ in range(6 * SCALE):
            y = torch.tanh(x)
        return y @ (self.qweight.float() * self.scale).t()
''' + serving("Int8Model")

QUANTIZED_REPLAY = QUANTIZED + '''
_ANSWER = []


def candidate(x):  # noqa: F811 - the attack: one answer for every input after the first
    if not _ANSWER:
        with torch.no_grad():
            _ANSWER.append(MODEL(x))
    return _ANSWER[0]
'''

QUANTIZED_SKIPS = QUANTIZED + '''
_CALLS = [0]


def candidate(x):  # noqa: F811 - the attack: every other call skips its work
    _CALLS[0] += 1
    if _CALLS[0] % 2 == 0:
        return torch.zeros(x.shape[0], 256)
    with torch.no_grad():
        return MODEL(x)
'''


def _template(factory: pytest.TempPathFactory, name: str, timing: str) -> Path:
    from filelock import FileLock

    base = factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    root = base / name
    with FileLock(str(base / f"{name}.lock")):
        if not (root / ".ditgate" / "baselined").exists():
            if root.exists():
                shutil.rmtree(root)
            project = create(root, contract=CLASSED_CONTRACT, timed=True)
            project.write("tests/gates/lane_timing.py", timing)
            project.commit("the lane's timing module")
            assert project.sh("git", "checkout", "-q", "-b", "autoresearch/timed").returncode == 0
            done = project.ditgate("baseline", "--lane", "timed")
            assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
            (root / ".ditgate" / "baselined").write_text("")
    return root


@pytest.fixture(scope="session")
def classed_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _template(tmp_path_factory, "classed-template", CLASSED_TIMING)


@pytest.fixture(scope="session")
def unclassed_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _template(tmp_path_factory, "unclassed-template", LANE_TIMING)


def experiment(template: Path, where: Path, body: str, message: str) -> tuple[Project, int, str]:
    project = copy(template, where)
    project.write("candidate/work.py", body)
    project.commit(message)
    done = project.ditgate("experiment", "--lane", "timed", "--class=quantization", f"--description={message}")
    return project, done.returncode, done.stdout + done.stderr


def test_an_honest_quantized_speedup_keeps_audited_against_a_fresh_process(classed_template: Path,
                                                                           tmp_path: Path) -> None:
    project, code, out = experiment(classed_template, tmp_path / "p", QUANTIZED, "int8 weights")
    assert code == 0, out[-3000:]
    verdict = project.verdict()
    assert verdict["classification"]["effective"] == "quantization"
    region = verdict["child"]["judge_timing"]["regions"]["forward"]
    assert region["audited_rounds"] and "a fresh process of each tree" in region["audit"], region
    assert (project.root / ".ditgate").exists()


def test_the_same_candidate_without_the_class_rule_is_refused_by_the_baseline_audit(unclassed_template: Path,
                                                                                   tmp_path: Path) -> None:
    _, code, out = experiment(unclassed_template, tmp_path / "p", QUANTIZED, "int8 weights")
    assert code == 12, out[-3000:]
    assert "differs from the baseline's for the same inputs" in out, out[-3000:]


@pytest.mark.parametrize("body", [QUANTIZED_REPLAY, QUANTIZED_SKIPS], ids=["replay", "skip-calls"])
def test_a_quantized_attack_does_not_reproduce_in_a_fresh_process(classed_template: Path, tmp_path: Path,
                                                                  body: str) -> None:
    _, code, out = experiment(classed_template, tmp_path / "p", body, "an attack")
    assert code == 12, out[-3000:]
    assert "differs from a fresh process of its own tree" in out, out[-3000:]
