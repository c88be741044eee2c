"""Helpers shared by the DiT gate tests (a uniquely named module: several conftest.py files exist)."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

from dit_impl.corpus import CorpusCase

#: random-weight seed of every model in this suite (goldens were frozen with it)
WEIGHTS_SEED = 0
#: XL/2 goldens keep activations of the first image and its first 64 tokens only (size budget)
XL_ACTIVATION_IMAGES, XL_ACTIVATION_TOKENS = 1, 64
#: shapes goldens keep every image (the learned metrics score the whole set), the first 20 latents (in
#: pixel space they repeat the images) and activations of the first image's first 64 tokens
SHAPES_LATENTS = 20


def shapes_tensors(result: Any) -> dict[str, Any]:
    """What a shapes case records: all images, the first latents, a slice of each activation."""
    tensors = result.tensors(activation_images=XL_ACTIVATION_IMAGES, activation_tokens=XL_ACTIVATION_TOKENS)
    return {name: (t[:SHAPES_LATENTS].contiguous() if name.endswith("latents") else t) for name, t in tensors.items()}


def latent_kinds(tensors: Any) -> dict[str, str]:
    """Pixel-space latents look like images (3 channels) but are not in [0, 1]: name their kind."""
    return {name: "latent" for name in tensors if name.endswith("latents")}


def shapes_model(dtype: str, device: str) -> Any:
    """The trained shapes model (shipped weights, sha256-checked), one per dtype and device."""
    from dit_impl.baseline import load_model

    key = (dtype, device)
    if key not in _SHAPES:
        _SHAPES[key] = load_model("dit-s-shapes", dtype=dtype, device=device)
    return _SHAPES[key]


_SHAPES: dict[tuple[str, str], Any] = {}


@contextlib.contextmanager
def full_fp32() -> Iterator[None]:
    """Disable TF32 in matmuls and convolutions, so a float32 reference is true float32 on the GPU."""
    from dit_impl.shapes.variants import tf32

    with tf32(False):
        yield


#: the metadata that makes a golden a case's baseline: a golden frozen with other values there (new weights,
#: another seed) is stale, not a mismatch; dtype, device and the implementation may differ (bf16 runs and
#: fast candidates are judged against float32 baseline goldens). ``weights`` names random weights' seed too
FROZEN_WITH = ("config", "weights", "seed", "steps", "scheduler", "guidance_scale", "class_labels")


def case_metadata(case: CorpusCase, info: dict[str, Any]) -> dict[str, Any]:
    """What a golden records about the run that made it (manifest provenance)."""
    return {"case": case.name, "weights_seed": WEIGHTS_SEED, **info}


def contract_compare(quality_gate: Any, case: str, *, experiment_class: str | None = None,
                     labels: Any = None) -> Callable[[Any, Any], Any]:
    """A golden comparator that judges with the quality contract, widened by the fallback tolerance scale;
    ``labels`` (one class per image) let the learned metrics judge the images."""

    def compare(candidate: Any, hit: Any) -> Any:
        __tracebackhide__ = True
        return quality_gate.check(case, candidate, hit.tensors, tolerance_scale=hit.tolerance_scale,
                                  experiment_class=experiment_class, labels=labels,
                                  kinds=latent_kinds(hit.tensors) if labels is not None else None)

    return compare


def fast_module(transformer: Any) -> Any:
    """The ``nn.Module`` behind a fast transformer (a ``GraphedDiT`` wraps its ``FastDiT``)."""
    return transformer if hasattr(transformer, "named_modules") else transformer.model


def drop_shift(monkeypatch: Any) -> None:
    """Fault for negative controls: adaLN modulate without its shift term (``norm(x) * (1 + scale)``), a
    plausible 'fusion' slip. The fast model's PyTorch adaLN ops look the op up at call time."""
    from dit_impl.fast import adaln
    from dit_impl.shapes.variants import modulate_without_shift

    monkeypatch.setattr(adaln, "norm_modulate", modulate_without_shift)


def case_sampling(case: CorpusCase) -> dict[str, Any]:
    """The sampling settings ``ditgate_candidate.declare`` compares with the frozen corpus."""
    return {"num_steps": case.steps, "scheduler": case.scheduler, "guidance_scale": case.guidance_scale}


class _Judged:
    """A quality result in the shape ``golden.check`` expects of a comparison (``passed``, ``lines``)."""

    def __init__(self, result: Any) -> None:
        self.result, self.passed = result, result.passed

    def lines(self) -> list[str]:
        return self.result.summary().splitlines()


def unrecorded_contract_compare(contract: Any, case: str, *, experiment_class: str,
                                labels: Any = None, models: Any = None) -> Callable[[Any, Any], Any]:
    """The contract comparator WITHOUT recording into the run's quality table: for negative controls,
    whose expected failures must not show as a rejected candidate; a failure is ``golden_mismatch``."""
    from pytest_ditgate.quality import evaluate_quality

    def compare(candidate: Any, hit: Any) -> Any:
        return _Judged(evaluate_quality(candidate, hit.tensors, contract=contract, experiment_class=experiment_class,
                                        case=case, tolerance_scale=hit.tolerance_scale, labels=labels, models=models,
                                        kinds=latent_kinds(hit.tensors) if labels is not None else None))

    return compare
