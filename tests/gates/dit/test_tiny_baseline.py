"""The ``tiny`` DiT workload against its committed CPU float32 goldens (runs on any CPU under --ditgate)."""

from __future__ import annotations

import copy

import pytest

from dit_gate_support import FROZEN_WITH, case_metadata, contract_compare
from pytest_ditgate.errors import GateFailure


def test_tiny_case_matches_frozen_baseline(tiny_case, tiny_model, dit_sampler, golden, quality_gate) -> None:
    result = dit_sampler(tiny_model, **tiny_case.sample_kwargs())
    outcome = golden.check(tiny_case.name, result.tensors(), device="cpu",
                           compare=contract_compare(quality_gate, tiny_case.name),
                           metadata=case_metadata(tiny_case, result.info), frozen_with=FROZEN_WITH)
    if outcome.status == "matched":  # not a fresh freeze: the contract judged every frozen tensor
        assert outcome.key_used == "cpu" and not outcome.fallback
        assert {name.rsplit(".", 1)[0] for name in outcome.comparison.metrics} == set(outcome.hit.tensors)


@pytest.mark.parametrize("damage", ["weights", "zeros", "guidance"])
def test_gate_rejects_a_wrong_candidate(damage, dit_corpus, tiny_model, dit_sampler, golden) -> None:
    """Negative control: a 1 % weight change, an all-zero output or a changed guidance scale must fail."""
    if golden.mode != "check":
        pytest.skip("negative control compares with existing goldens; nothing to check while freezing")
    case = next(c for c in dit_corpus if c.config == "tiny")
    model, kwargs = tiny_model, case.sample_kwargs()
    if damage == "weights":
        import torch

        model = copy.deepcopy(tiny_model)
        with torch.no_grad():
            model.transformer.transformer_blocks[1].ff.net[2].weight.mul_(1.01)
    if damage == "guidance":
        kwargs["guidance_scale"] += 0.5
    tensors = dit_sampler(model, **kwargs).tensors()
    if damage == "zeros":
        tensors = {name: t * 0 for name, t in tensors.items()}
    with pytest.raises(GateFailure) as info:
        golden.check(case.name, tensors, device="cpu")
    assert info.value.reason == "golden_mismatch"
    assert "FAIL latents" in str(info.value)
