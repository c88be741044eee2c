"""The trained ``dit-s-shapes`` workload: cases whose images mean something, judged on perceptual quality.

Every shapes case is scored by the shipped classifier (class accuracy, Frechet distance to real images)
as well as on pixels and latents. On the CPU the float32 model runs against the ``cpu`` goldens; on a
GPU bf16 runs against float32 goldens frozen on the same arch. The negative controls prove that the
harmful changes the calibration measured (a dropped adaLN shift, the erf-for-tanh GELU swap) fail
``numerical``, and that quantization is judged by zero regression of the learned metrics.
"""

from __future__ import annotations

from typing import Any

import pytest

from dit_gate_support import (FROZEN_WITH, case_metadata, contract_compare, drop_shift, full_fp32, latent_kinds,
                              shapes_model, shapes_tensors)

GPU = pytest.mark.requires_gpu(bf16=True, why="dit-s-shapes on the GPU")
LEARNED = {"class_accuracy", "frechet_distance"}


def _device_case(corpus: Any, device: str) -> Any:
    """The first shapes case of the device's tag (``cpu`` or ``gpu``)."""
    from dit_impl.corpus import select

    return select(corpus, config="dit-s-shapes", tag="cpu" if device == "cpu" else "gpu")[0]


def _sample(case: Any, model: Any) -> dict[str, Any]:
    from dit_impl.fast.sampling import sample

    with full_fp32():
        return shapes_tensors(sample(model, **case.sample_kwargs()))


def quality_inputs(case: Any, tensors: dict[str, Any]) -> dict[str, Any]:
    """What the contract judges the case with beyond its tensors, frozen with the golden for the judge."""
    return {"kinds": latent_kinds(tensors), "labels": case.labels}


def test_shapes_cpu_case_matches_frozen_baseline(shapes_cpu_case, golden, quality_gate, dit_sampler) -> None:
    case = shapes_cpu_case
    result = dit_sampler(shapes_model("float32", "cpu"), **case.sample_kwargs())
    tensors = shapes_tensors(result)
    outcome = golden.check(case.name, tensors, device="cpu",
                           compare=contract_compare(quality_gate, case.name, labels=case.labels),
                           metadata=case_metadata(case, result.info), frozen_with=FROZEN_WITH,
                           quality_inputs=quality_inputs(case, tensors))
    if outcome.status == "matched":  # not a fresh freeze: the learned metrics judged the images
        assert LEARNED <= set(outcome.comparison.perceptual)


@GPU
def test_shapes_bf16_passes_numerical_against_fp32_golden(shapes_gpu_case, golden, quality_gate, dit_sampler) -> None:
    case = shapes_gpu_case
    dtype = "float32" if golden.mode != "check" else "bfloat16"
    with full_fp32():
        result = dit_sampler(shapes_model(dtype, "cuda"), **case.sample_kwargs())
    tensors = shapes_tensors(result)
    outcome = golden.check(case.name, tensors, device="cuda",
                           compare=contract_compare(quality_gate, case.name, experiment_class="numerical",
                                                    labels=case.labels),
                           metadata=case_metadata(case, result.info), frozen_with=FROZEN_WITH,
                           quality_inputs=quality_inputs(case, tensors))
    if outcome.status == "matched":
        assert LEARNED <= set(outcome.comparison.perceptual)


def dropped_shift_outputs(case: Any, device: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The case sampled by the fast DiT (PyTorch adaLN, float32) with adaLN's shift term dropped (cached:
    two negative controls judge the same outputs)."""
    from dit_impl.fast.options import FastOptions
    from dit_impl.fast.sampling import fast_model

    key = (case.name, device)
    if key not in _DROPPED:
        drop_shift(monkeypatch)
        _DROPPED[key] = _sample(case, fast_model(shapes_model("float32", device), FastOptions(dtype="float32",
                                                                                             sdpa="math")))
    return _DROPPED[key]


_DROPPED: dict[tuple[str, str], dict[str, Any]] = {}


def judge_against_golden(case: Any, tensors: dict[str, Any], golden: Any, quality_gate: Any, experiment_class: str,
                         device: str) -> Any:
    """The contract's verdict on ``tensors`` against the case's golden, not recorded as the run's candidate."""
    from pytest_ditgate.quality import evaluate_quality

    hit = golden.load(case.name, device=device)
    return evaluate_quality(tensors, hit.tensors, contract=quality_gate.contract, experiment_class=experiment_class,
                            case=case.name, tolerance_scale=hit.tolerance_scale, labels=case.labels,
                            kinds=latent_kinds(hit.tensors), models=quality_gate.models)


DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=GPU)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fault", ["dropped_shift", "erf_gelu"])
def test_harmful_change_fails_numerical(fault, device, dit_corpus, monkeypatch, golden, quality_gate) -> None:
    """Negative control: each harmful change, sampled in float32, fails the float32 ``numerical`` contract."""
    if golden.mode != "check":
        pytest.skip("negative control compares with existing goldens; nothing to check while freezing")
    case = _device_case(dit_corpus, device)
    if fault == "erf_gelu":
        from dit_impl.shapes.variants import erf_gelu

        tensors = _sample(case, erf_gelu(shapes_model("float32", device)))
    else:
        tensors = dropped_shift_outputs(case, device, monkeypatch)
    result = judge_against_golden(case, tensors, golden, quality_gate, "numerical", device)
    assert not result.passed, f"{fault} passed numerical: {result.metrics}"
    assert any(failure.startswith(("latents.", "images.")) for failure in result.failures), result.failures


@pytest.mark.parametrize("device", DEVICES)
def test_quantization_with_identical_outputs_passes(device, dit_corpus, golden, quality_gate) -> None:
    """Quantization is judged, not refused: the baseline's own outputs pass it, scored by the learned metrics."""
    if golden.mode != "check":
        pytest.skip("compares with existing goldens")
    case = _device_case(dit_corpus, device)
    hit = golden.load(case.name, device=device)
    result = judge_against_golden(case, dict(hit.tensors), golden, quality_gate, "quantization", device)
    assert result.passed, result.summary()
    assert LEARNED <= set(result.perceptual)


@pytest.mark.parametrize("device", DEVICES)
def test_quantization_rejects_a_perceptual_regression(device, dit_corpus, monkeypatch, golden, quality_gate) -> None:
    """A change that makes the images worse fails ``quantization`` on the learned metrics (zero regression)."""
    if golden.mode != "check":
        pytest.skip("compares with existing goldens")
    case = _device_case(dit_corpus, device)
    tensors = dropped_shift_outputs(case, device, monkeypatch)
    result = judge_against_golden(case, tensors, golden, quality_gate, "quantization", device)
    assert not result.passed
    assert any(failure.split(" ")[0].rsplit(".", 1)[-1] in LEARNED for failure in result.failures), result.failures
