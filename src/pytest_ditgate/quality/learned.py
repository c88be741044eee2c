"""Offline learned metrics: class accuracy and a Frechet distance from a classifier the project supplies.

A project names a factory, ``"package.module:callable"`` (``--ditgate-classifier``, ini
``ditgate_classifier`` or ``[tool.ditgate] classifier``); called with a device, it returns an object with

* ``logits(images) -> (N, classes)`` and ``features(images) -> (N, F)`` for ``[0, 1]`` images, and
* ``reference_statistics() -> (mu, sigma)``: feature mean and covariance of real images (the FID reference).

Nothing is downloaded: the classifier is the project's own, trained on its own data.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any, Sequence

from pytest_ditgate.errors import DitgateUsageError

if TYPE_CHECKING:
    import torch

HOW_CLASSIFIER = ("name a classifier factory 'package.module:callable' with --ditgate-classifier (ini "
                  "ditgate_classifier, [tool.ditgate] classifier): called with a device, it returns an object "
                  "with logits(images), features(images) and reference_statistics()")
REQUIRED_METHODS = ("logits", "features", "reference_statistics")


def load_factory(spec: str, root: str | None = None) -> Any:
    """Import ``package.module:callable``, also from the project ``root``; a bad spec is a usage error."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise DitgateUsageError(f"classifier factory {spec!r} must be written 'package.module:callable'")
    if root and root not in sys.path:
        sys.path.append(root)  # the project's own package, as pytest's rootdir conftest makes it importable
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise DitgateUsageError(f"classifier factory {spec!r}: cannot import {module_name!r} ({exc})") from None
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise DitgateUsageError(f"classifier factory {spec!r}: {module_name!r} has no {attribute!r}") from None


def build_classifier(spec: str, device: Any, root: str | None = None) -> Any:
    """The project's classifier on ``device``, checked to have the methods the metrics call."""
    classifier = load_factory(spec, root)(device)
    missing = [name for name in REQUIRED_METHODS if not callable(getattr(classifier, name, None))]
    if missing:
        raise DitgateUsageError(f"classifier factory {spec!r} returned a {type(classifier).__name__} without "
                                f"{', '.join(missing)}; {HOW_CLASSIFIER}")
    return classifier


def class_accuracy(classifier: Any, images: "torch.Tensor", labels: Sequence[int]) -> float:
    """Fraction of ``[0, 1]`` images the classifier assigns to their label."""
    import torch

    if len(labels) != images.shape[0]:
        raise DitgateUsageError(f"class_accuracy: {len(labels)} labels for {images.shape[0]} images")
    with torch.no_grad():
        predicted = classifier.logits(images).argmax(dim=1).cpu()
    return float((predicted == torch.as_tensor(list(labels))).double().mean())


def frechet_distance(classifier: Any, images: "torch.Tensor") -> float:
    """Frechet distance of the images' feature Gaussian to the classifier's real-image reference."""
    import torch

    if images.shape[0] < 2:
        raise DitgateUsageError(f"frechet_distance needs at least 2 images, got {images.shape[0]}")
    with torch.no_grad():
        features = classifier.features(images).double().cpu()
    mu, sigma = classifier.reference_statistics()
    return gaussian_frechet(features, mu, sigma)


def feature_statistics(features: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
    """Mean and (unbiased) covariance of features (N, F), in float64 on the CPU."""
    import torch

    f = features.detach().double().cpu()
    return f.mean(dim=0), torch.cov(f.T).reshape(f.shape[1], f.shape[1])


def gaussian_frechet(features: "torch.Tensor", mu: "torch.Tensor", sigma: "torch.Tensor") -> float:
    """``|m1 - m2|^2 + tr(S1 + S2 - 2 (S1^1/2 S2 S1^1/2)^1/2)`` in float64, by symmetric eigendecompositions."""
    import torch

    mu1, s1 = feature_statistics(features)
    mu2, s2 = mu.double().cpu(), sigma.double().cpu()
    if mu2.shape != mu1.shape or s2.shape != s1.shape:
        raise DitgateUsageError(f"frechet_distance: reference statistics {tuple(mu2.shape)}, {tuple(s2.shape)} do "
                                f"not fit features of width {mu1.shape[0]}")
    values, vectors = torch.linalg.eigh(s1)
    root = vectors @ torch.diag(values.clamp(min=0).sqrt()) @ vectors.T
    middle = torch.linalg.eigvalsh(root @ s2 @ root).clamp(min=0).sqrt().sum()
    return float((mu1 - mu2).pow(2).sum() + torch.trace(s1) + torch.trace(s2) - 2 * middle)
