"""Helpers shared by the DiT gate tests (a uniquely named module: several conftest.py files exist)."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

from dit_impl.corpus import CorpusCase

#: random-weight seed of every model in this suite (goldens were frozen with it)
WEIGHTS_SEED = 0
#: XL/2 goldens keep activations of the first image and its first 64 tokens only (size budget)
XL_ACTIVATION_IMAGES, XL_ACTIVATION_TOKENS = 1, 64


@contextlib.contextmanager
def full_fp32() -> Iterator[None]:
    """Disable TF32 in matmuls and convolutions, so a float32 reference is true float32 on the GPU."""
    import torch

    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def case_metadata(case: CorpusCase, info: dict[str, Any]) -> dict[str, Any]:
    """What a golden records about the run that made it (manifest provenance)."""
    return {"case": case.name, "weights_seed": WEIGHTS_SEED, **info}


def contract_compare(quality_gate: Any, case: str, *, experiment_class: str | None = None) -> Callable[[Any, Any], Any]:
    """A golden comparator that judges with the quality contract, widened by the fallback tolerance scale."""

    def compare(candidate: Any, hit: Any) -> Any:
        __tracebackhide__ = True
        return quality_gate.check(case, candidate, hit.tensors, tolerance_scale=hit.tolerance_scale,
                                  experiment_class=experiment_class)

    return compare


def fast_module(transformer: Any) -> Any:
    """The ``nn.Module`` behind a fast transformer (a ``GraphedDiT`` wraps its ``FastDiT``)."""
    return transformer if hasattr(transformer, "named_modules") else transformer.model


def drop_shift(monkeypatch: Any) -> None:
    """Fault for negative controls: adaLN modulate without its shift term (``norm(x) * (1 + scale)``), a
    plausible 'fusion' slip. The fast model's PyTorch adaLN ops look the op up at call time."""
    import torch.nn.functional as F

    from dit_impl.fast import adaln

    monkeypatch.setattr(adaln, "norm_modulate",
                        lambda x, shift, scale, eps: F.layer_norm(x, x.shape[-1:], eps=eps) * (1 + scale[:, None]))


def case_sampling(case: CorpusCase) -> dict[str, Any]:
    """The sampling settings ``ditgate_candidate.declare`` compares with the frozen corpus."""
    return {"num_steps": case.steps, "scheduler": case.scheduler, "guidance_scale": case.guidance_scale}


class _Judged:
    """A quality result in the shape ``golden.check`` expects of a comparison (``passed``, ``lines``)."""

    def __init__(self, result: Any) -> None:
        self.result, self.passed = result, result.passed

    def lines(self) -> list[str]:
        return self.result.summary().splitlines()


def unrecorded_contract_compare(contract: Any, case: str, *, experiment_class: str) -> Callable[[Any, Any], Any]:
    """The contract comparator WITHOUT recording into the run's quality table: for negative controls,
    whose expected failures must not show as a rejected candidate; a failure is ``golden_mismatch``."""
    from pytest_ditgate.quality import evaluate_quality

    def compare(candidate: Any, hit: Any) -> Any:
        return _Judged(evaluate_quality(candidate, hit.tensors, contract=contract, experiment_class=experiment_class,
                                        case=case, tolerance_scale=hit.tolerance_scale))

    return compare
