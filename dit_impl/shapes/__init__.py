"""The ``dit-s-shapes`` workload: a procedural image family, a small DiT and a classifier trained on it.

The trained weights ship in ``fixtures/shapes/`` (manifest with training command, data seed and sha256);
the classifier gives offline perceptual metrics (class accuracy, a Frechet distance on its features).
Torch is imported on first use, not when this package is imported.
"""

from __future__ import annotations

from pytest_ditgate.lazy import lazy_exports

_LAZY = {
    "CLASSES": "dit_impl.shapes.family",
    "render": "dit_impl.shapes.family",
    "ShapesClassifier": "dit_impl.shapes.classifier",
    "load_classifier": "dit_impl.shapes.classifier",
    "scorer": "dit_impl.shapes.scorer",
    "WEIGHTS_DIR": "dit_impl.shapes.bundle",
    "verify_bundle": "dit_impl.shapes.bundle",
    "BundleError": "dit_impl.shapes.bundle",
}

__all__ = list(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY)
