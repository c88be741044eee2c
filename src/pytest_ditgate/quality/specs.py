"""The quality metrics the plugin knows: name, direction, tensor kinds, and how each is compared.

Torch-free, so that the contract can be validated without importing torch. A *pair* metric compares the
candidate with the baseline (PSNR, relative L2, ...): its value for identical tensors is ``ideal``. A
*score* metric is measured on each side separately (CLIP score of an image against its prompt): the
candidate's value is compared with the baseline's, and a floor can be checked on both.
"""

from __future__ import annotations

from dataclasses import dataclass

IMAGE = "image"
LATENT = "latent"
ACTIVATION = "activation"
KINDS = (IMAGE, LATENT, ACTIVATION)

HIGHER = "higher"
LOWER = "lower"

#: the experiment classes, from least to most constrained quality contract (the one owner of this list)
EXPERIMENT_CLASSES = ("exact", "numerical", "approximate", "quantization")
DEFAULT_CLASS = "numerical"


@dataclass(frozen=True)
class MetricSpec:
    name: str
    direction: str  # HIGHER or LOWER is better
    kinds: tuple[str, ...]
    pair: bool = True
    ideal: float | None = None  # pair metrics: the value for identical tensors
    needs: str | None = None  # "lpips", "clip" (pretrained weights) or "classifier" (the project's own)
    doc: str = ""

    @property
    def perceptual(self) -> bool:
        """Judges what an image shows (a learned network), not how close its pixels are."""
        return self.needs is not None


_ALL = KINDS
_TENSORS = (LATENT, ACTIVATION)
INF = float("inf")

METRICS: dict[str, MetricSpec] = {spec.name: spec for spec in (
    MetricSpec("psnr", HIGHER, (IMAGE,), ideal=INF, doc="PSNR in dB of the worst image (torchmetrics)"),
    MetricSpec("ssim", HIGHER, (IMAGE,), ideal=1.0, doc="SSIM of the worst image (torchmetrics, 11x11 gaussian)"),
    MetricSpec("worst_tile_mae", LOWER, (IMAGE,), ideal=0.0,
               doc="mean absolute error of the worst tile (tile x tile px): a corrupted patch cannot hide"),
    MetricSpec("lpips", LOWER, (IMAGE,), ideal=0.0, needs="lpips", doc="LPIPS (AlexNet) of the worst image"),
    MetricSpec("clip_score", HIGHER, (IMAGE,), pair=False, needs="clip",
               doc="mean CLIP score 100*cos(image, prompt), measured on baseline and candidate"),
    MetricSpec("class_accuracy", HIGHER, (IMAGE,), pair=False, needs="classifier",
               doc="fraction of images the project's classifier assigns to their class label"),
    MetricSpec("frechet_distance", LOWER, (IMAGE,), pair=False, needs="classifier",
               doc="Frechet distance of the images' classifier features to the real-image reference (an FID)"),
    MetricSpec("rel_l2", LOWER, _ALL, ideal=0.0, doc="||candidate - baseline|| / ||baseline||"),
    MetricSpec("max_abs_error", LOWER, _ALL, ideal=0.0, doc="max |candidate - baseline|"),
    MetricSpec("max_rel_error", LOWER, _TENSORS, ideal=0.0,
               doc="max |c - b| / max(|b|, 1e-3 * max|b|) (the floor keeps near-zero elements finite)"),
    MetricSpec("cosine", HIGHER, _ALL, ideal=1.0, doc="cosine similarity of the flattened tensors"),
    MetricSpec("max_ulp", LOWER, _ALL, ideal=0.0,
               doc="largest distance in units in the last place of the baseline's dtype (0 = bitwise)"),
)}

#: the key of a limit table's fallback (its dtype keys are :data:`pytest_ditgate.dtypes.CONTRACT_KEYS`)
DEFAULT_DTYPE_KEY = "default"
