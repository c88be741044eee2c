"""DiT-XL/2 (random weights, seed 0) in bf16 against float32 goldens frozen on the same arch.

Freezing (``--ditgate-freeze``) runs the float32 reference with TF32 off; a check run runs bf16 and
must pass the ``numerical`` contract. ``exact`` must reject bf16 (it is not bitwise).
"""

from __future__ import annotations

import pytest

from dit_gate_support import (FROZEN_WITH, WEIGHTS_SEED, XL_ACTIVATION_IMAGES, XL_ACTIVATION_TOKENS, case_metadata,
                              contract_compare, full_fp32)

pytestmark = pytest.mark.requires_gpu(bf16=True, min_memory_gb=20, why="DiT-XL/2 sampling")

_models: dict[str, object] = {}


def xl_model(dtype: str):
    """One XL/2 model per dtype for the module (random init on the GPU takes seconds)."""
    from dit_impl.baseline import load_model

    if dtype not in _models:
        _models.clear()
        _models[dtype] = load_model("dit-xl-2-256", seed=WEIGHTS_SEED, dtype=dtype, device="cuda")
    return _models[dtype]


def run_xl(case, dtype: str, sampler):
    with full_fp32():
        result = sampler(xl_model(dtype), **case.sample_kwargs())
    return result, result.tensors(activation_images=XL_ACTIVATION_IMAGES, activation_tokens=XL_ACTIVATION_TOKENS)


def test_xl_bf16_passes_numerical_against_fp32_golden(xl_case, golden, quality_gate, dit_sampler) -> None:
    dtype = "float32" if golden.mode != "check" else "bfloat16"
    result, tensors = run_xl(xl_case, dtype, dit_sampler)
    outcome = golden.check(xl_case.name, tensors, device="cuda",
                           compare=contract_compare(quality_gate, xl_case.name, experiment_class="numerical"),
                           metadata=case_metadata(xl_case, result.info), frozen_with=FROZEN_WITH)
    if outcome.status == "matched":  # not a fresh freeze: the contract judged every frozen tensor
        assert {name.rsplit(".", 1)[0] for name in outcome.comparison.metrics} == set(outcome.hit.tensors)


def test_xl_bf16_fails_exact(xl_case, golden, quality_gate, dit_sampler) -> None:
    if golden.mode != "check":
        pytest.skip("compares with existing goldens")
    from pytest_ditgate.quality import evaluate_quality

    _, tensors = run_xl(xl_case, "bfloat16", dit_sampler)
    hit = golden.load(xl_case.name, device="cuda")
    result = evaluate_quality(tensors, hit.tensors, contract=quality_gate.contract, experiment_class="exact",
                              case=xl_case.name, tolerance_scale=hit.tolerance_scale)
    assert not result.passed, "bf16 sampling cannot be bitwise equal to the float32 reference"
    assert any("max_ulp" in failure for failure in result.failures)
