"""The judge and the experiment classes: a sampling that executed differently is ``approximate`` whatever was
claimed, a case the contract judges on its structure only is judged so and the verdict says it, and float32
outputs of TF32 GEMMs are held to TF32's limits (by what the candidate's process ran)."""

from __future__ import annotations

import pytest

from judge_project import CANDIDATE, CONTRACT as BASE_CONTRACT, PYPROJECT as BASE_PYPROJECT, Project, create

torch = pytest.importorskip("torch")

#: a lane of class numerical (the template's is exact)
PYPROJECT = BASE_PYPROJECT.replace('class = "exact"', 'class = "numerical"')

#: the random-weight-like case0 is judged on its structure only under approximate
CONTRACT = BASE_CONTRACT.replace("[metrics.rel_l2]", '[structural]\napproximate = ["case0"]\n\n[metrics.rel_l2]')

#: the candidate's REPEAT plays the sampler's step count: the gate records it as executed, the frozen case has 24
GATE = """
import torch
from candidate import work
from candidate.work import build, candidate
from reference.work import reference


def data():
    return torch.randn(64, 256, generator=torch.Generator().manual_seed(0))


def test_quality(golden, quality_gate, ditgate_candidate):
    ditgate_candidate.declare(build(), sampling={"num_steps": work.REPEAT, "blocks_per_call": 2},
                              frozen_sampling={"num_steps": 24, "blocks_per_call": 2})

    def compare(cand, hit):
        return quality_gate.check("case0", cand, hit.tensors, tolerance_scale=hit.tolerance_scale)

    golden.check("case0", {"act": candidate(data())}, compare=compare)


def test_speed(ditbench):  # an approximate candidate computes another output by design: no agreement check
    ditbench.pair(candidate, reference, data(), min_speedup=None, verify=False)
"""

#: another output altogether (the 'noise' of another sampler): no metric means anything on case0
OTHER_OUTPUT = CANDIDATE.replace("        return self.proj(y)", "        return self.proj(y).flip(0) * 1.5")
NOT_FINITE = CANDIDATE.replace("        return self.proj(y)", "        return self.proj(y) * float('nan')")


@pytest.fixture(scope="module")
def baselined(tmp_path_factory: pytest.TempPathFactory) -> Project:
    project = create(tmp_path_factory.mktemp("classes") / "project", pyproject=PYPROJECT, contract=CONTRACT,
                     gate=GATE)
    done = project.ditgate("baseline", "--lane", "fwd")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    return project


@pytest.mark.slow
def test_a_changed_sampling_is_approximate_and_judged_on_structure_where_the_contract_says(baselined) -> None:
    baselined.candidate(repeat=4, body=OTHER_OUTPUT)  # fewer 'steps', another output, claimed numerical
    baselined.commit("fewer steps")
    result = baselined.experiment(cls="numerical", description="fewer steps")
    verdict = baselined.verdict()
    assert verdict["classification"]["effective"] == "approximate", verdict["classification"]
    assert "approx: num_steps 24 -> 4" in verdict["classification"]["evidence"]
    (case,) = verdict["quality"]
    assert case["passed"] and case["metrics"] == {} and "judged on shapes and finiteness only" in case["judged_on"]
    assert "note: judged on shapes and finiteness only" in result.stdout
    assert result.returncode in (0, 11), result.stdout[-3000:]  # judged on speed: not a quality verdict
    assert result.returncode == verdict["verdict"]["exit_code"]


@pytest.mark.slow
def test_structure_only_still_refuses_outputs_that_are_not_finite(baselined) -> None:
    baselined.candidate(repeat=4, body=NOT_FINITE)
    baselined.commit("fewer steps, NaN")
    result = baselined.experiment(cls="approximate", description="fewer steps, NaN")
    assert result.returncode == 10, result.stdout[-3000:]
    assert "is not finite" in result.stdout + str(baselined.verdict()["verdict"]["reasons"])
    assert baselined.sh("git", "reset", "-q", "--hard", "HEAD^").returncode == 0


def test_float32_outputs_of_tf32_gemms_are_held_to_tf32s_limits(tmp_path) -> None:
    """What the child observed (``class.json``'s ``tf32_gemms``) picks the dtype key the judge compares with."""
    from pytest_ditgate.experiment.evidence import ChildEvidence, _compare, _tf32_dtype

    float32 = {"act": torch.ones(4, 4)}
    ran = ChildEvidence(tmp_path, observed={"tf32_gemms": 3})
    assert _tf32_dtype(ran, float32, "sm_90") == "tf32"
    assert _tf32_dtype(ran, float32, "cpu") is None  # an output of the CPU cases never ran TF32
    assert _tf32_dtype(ran, {"act": torch.ones(4, 4, dtype=torch.bfloat16)}, "sm_90") is None  # bf16's limits
    assert _tf32_dtype(ChildEvidence(tmp_path, observed={"tf32_gemms": 0}), float32, "sm_90") is None
    assert _tf32_dtype(ChildEvidence(tmp_path, observed={"tf32_gemms": "3"}), float32, "sm_90") is None  # forged

    contract = tmp_path / "c.toml"
    contract.write_text('[metrics.rel_l2]\nkinds = ["activation"]\n[metrics.rel_l2.numerical]\n'
                        'max = { fp32 = 1e-6, tf32 = 1e-2 }\n')

    class Hit:
        tensors = {"act": torch.ones(4, 4)}
        tolerance_scale = 1.0

    close = {"act": torch.ones(4, 4) * 1.001}
    assert not _compare(close, Hit(), "numerical", contract, "case0", {"compute_dtype": None})[0]
    assert _compare(close, Hit(), "numerical", contract, "case0", {"compute_dtype": "tf32"})[0]
