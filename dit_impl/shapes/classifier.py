"""A small CNN trained on the shapes family: class logits, and features for a Frechet distance.

The network carries the Frechet reference statistics of real images (``reference_mu``,
``reference_sigma``: mean and covariance of its features on a stated number of real images from a
stated seed) as buffers, so one safetensors file holds everything the offline metrics need.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dit_impl.shapes.family import NUM_CLASSES

if TYPE_CHECKING:
    import torch

FEATURES = 64


def _build():
    import torch
    from torch import nn

    class ShapesClassifier(nn.Module):
        """Conv trunk (32x32 -> 4x4) then a 64-wide feature layer and a linear head over the classes."""

        def __init__(self) -> None:
            super().__init__()
            def block(cin: int, cout: int) -> list[nn.Module]:
                return [nn.Conv2d(cin, cout, 3, padding=1), nn.GroupNorm(8, cout), nn.GELU()]
            self.trunk = nn.Sequential(*block(3, 32), *block(32, 32), nn.AvgPool2d(2),
                                       *block(32, 64), *block(64, 64), nn.AvgPool2d(2),
                                       *block(64, 96), nn.AvgPool2d(2), nn.Flatten(),
                                       nn.Linear(96 * 16, FEATURES), nn.GELU())
            self.head = nn.Linear(FEATURES, NUM_CLASSES)
            self.register_buffer("reference_mu", torch.zeros(FEATURES, dtype=torch.float64))
            self.register_buffer("reference_sigma", torch.eye(FEATURES, dtype=torch.float64))

        def features(self, images: torch.Tensor) -> torch.Tensor:
            """Features of ``[0, 1]`` images (N, 3, 32, 32) -> (N, 64), float32."""
            return self.trunk(images.float() * 2 - 1)

        def forward(self, images: torch.Tensor) -> torch.Tensor:
            return self.head(self.features(images))

    return ShapesClassifier


_CLASS = None


def ShapesClassifier():  # noqa: N802 - a class built on first use, so torch is not imported with this module
    """A fresh (untrained) classifier."""
    global _CLASS
    if _CLASS is None:
        _CLASS = _build()
    return _CLASS()


def load_classifier(path: str | Path, *, device: "torch.device | str" = "cpu") -> "torch.nn.Module":
    """The classifier from a safetensors file (every tensor must fit: a foreign file is named and refused)."""
    from safetensors.torch import load_file

    model = ShapesClassifier()
    state = load_file(str(path), device=str(device))
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ValueError(f"{path} is not a shapes classifier state dict: {exc}") from None
    return model.to(device).eval().requires_grad_(False)
