"""Quality gate: metrics (PSNR, SSIM, worst-tile error, LPIPS, CLIP score, tensor errors), the quality
contract per experiment class, and failure images. Torch-free to import; names resolve lazily."""

from __future__ import annotations

from pytest_ditgate.lazy import lazy_exports

_LAZY = {
    "load_contract": "pytest_ditgate.quality.contract",
    "contract_from_dict": "pytest_ditgate.quality.contract",
    "QualityContract": "pytest_ditgate.quality.contract",
    "ContractError": "pytest_ditgate.quality.contract",
    "evaluate_quality": "pytest_ditgate.quality.evaluate",
    "QualityResult": "pytest_ditgate.quality.evaluate",
    "guess_kind": "pytest_ditgate.quality.evaluate",
    "PerceptualModels": "pytest_ditgate.quality.perceptual",
    "WeightsConfig": "pytest_ditgate.quality.perceptual",
    "MissingWeights": "pytest_ditgate.quality.perceptual",
    "METRICS": "pytest_ditgate.quality.specs",
    "EXPERIMENT_CLASSES": "pytest_ditgate.quality.specs",
}

__all__ = list(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY)
