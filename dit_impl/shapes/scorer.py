"""The project's classifier factory for the quality gate's learned metrics (``[tool.ditgate] classifier``).

``scorer(device)`` loads the shipped shapes classifier after checking the bundle's sha256 manifest; its
reference statistics are those of 10 000 real images from the manifest's stated seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass
class ShapesScorer:
    """What ``pytest_ditgate.quality.learned`` calls: logits, features and the real-image reference."""

    model: Any

    def logits(self, images: "torch.Tensor") -> "torch.Tensor":
        return self.model(images.to(self.model.reference_mu.device, dtype=self.model.head.weight.dtype))

    def features(self, images: "torch.Tensor") -> "torch.Tensor":
        return self.model.features(images.to(self.model.reference_mu.device, dtype=self.model.head.weight.dtype))

    def reference_statistics(self) -> tuple["torch.Tensor", "torch.Tensor"]:
        return self.model.reference_mu, self.model.reference_sigma


def scorer(device: Any = "cpu") -> ShapesScorer:
    """The shipped classifier on ``device`` (``BundleError`` names a missing or altered file)."""
    from dit_impl.shapes.bundle import CLASSIFIER, WEIGHTS_DIR, verify_bundle
    from dit_impl.shapes.classifier import load_classifier

    verify_bundle(WEIGHTS_DIR)
    return ShapesScorer(load_classifier(WEIGHTS_DIR / CLASSIFIER, device=device))
