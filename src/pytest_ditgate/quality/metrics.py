"""Pure tensor metrics comparing a candidate with its baseline. torch is imported inside each function.

Images are ``(N, C, H, W)`` (or ``(C, H, W)``) with 1 or 3 channels, floating point in a *declared*
range, ``[0, 1]`` or ``[-1, 1]`` (uint8 images are read as ``[0, 255]``); :func:`as_unit_images`
validates and maps them to ``[0, 1]``, where every image metric here works (data range 1).
Per-image metrics return one value per image so a gate can judge the worst image, not the average.
NaN or Inf anywhere raises :class:`NonFiniteError` naming the tensor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_ditgate.dtypes import torch_name
from pytest_ditgate.errors import DitgateUsageError

if TYPE_CHECKING:
    import torch

#: values may stray this far outside the declared image range (resampling overshoot, bf16 rounding)
RANGE_SLACK = 1e-2
#: max_rel_error divides by max(|b|, REL_FLOOR * max|b|) so near-zero elements cannot make it infinite
REL_FLOOR = 1e-3


class NonFiniteError(ValueError):
    """A tensor holds NaN or Inf; the message names the tensor and counts them."""

    def __init__(self, name: str, nan: int, inf: int, total: int) -> None:
        super().__init__(f"tensor {name!r} is not finite: {nan} NaN and {inf} Inf values out of {total}")
        self.name = name


def check_finite(tensor: "torch.Tensor", name: str) -> None:
    """Raise :class:`NonFiniteError` naming ``name`` when ``tensor`` holds NaN or Inf."""
    import torch

    if not (tensor.is_floating_point() or tensor.is_complex()):
        return
    finite = torch.isfinite(tensor)
    if bool(finite.all()):
        return
    nan = int(torch.isnan(tensor).sum())
    raise NonFiniteError(name, nan, int((~finite).sum()) - nan, tensor.numel())


def as_unit_images(tensor: "torch.Tensor", name: str, value_range: tuple[float, float] = (0.0, 1.0)) -> "torch.Tensor":
    """``tensor`` as float32 ``(N, C, H, W)`` images in ``[0, 1]``, after checking shape and declared range."""
    import torch

    images = tensor.detach()
    if images.dim() == 3:
        images = images.unsqueeze(0)
    if images.dim() != 4 or images.shape[1] not in (1, 3):
        raise DitgateUsageError(f"image tensor {name!r} has shape {tuple(tensor.shape)}; expected (N, C, H, W) or "
                                f"(C, H, W) with 1 or 3 channels")
    if images.dtype == torch.uint8:
        return images.float() / 255.0
    if not images.is_floating_point():
        raise DitgateUsageError(f"image tensor {name!r} has dtype {images.dtype}; expected floating point or uint8")
    check_finite(images, name)
    images = images.float()
    low, high = value_range
    seen_low, seen_high = float(images.min()), float(images.max())
    slack = RANGE_SLACK * (high - low)
    if seen_low < low - slack or seen_high > high + slack:
        other = "[-1, 1]" if low == 0.0 else "[0, 1]"
        raise DitgateUsageError(f"image tensor {name!r} has values in [{seen_low:.4g}, {seen_high:.4g}], outside the "
                                f"declared range [{low:g}, {high:g}]; if its images are in {other}, declare that "
                                f"(image_range=... or [images] range in the quality contract)")
    return ((images - low) / (high - low)).clamp(0.0, 1.0)


def psnr_per_image(candidate: "torch.Tensor", baseline: "torch.Tensor") -> "torch.Tensor":
    """PSNR in dB of each image pair (``[0, 1]`` images; ``inf`` for identical images)."""
    from torchmetrics.functional.image import peak_signal_noise_ratio

    return peak_signal_noise_ratio(candidate.double(), baseline.double(), data_range=1.0, reduction="none",
                                   dim=(1, 2, 3))


def ssim_per_image(candidate: "torch.Tensor", baseline: "torch.Tensor") -> "torch.Tensor":
    """SSIM of each image pair (``[0, 1]`` images, torchmetrics' 11x11 gaussian window)."""
    from torchmetrics.functional.image import structural_similarity_index_measure

    if min(candidate.shape[-2:]) < 11:
        raise DitgateUsageError(f"SSIM needs images of at least 11x11 px, got {tuple(candidate.shape[-2:])}")
    return structural_similarity_index_measure(candidate.float(), baseline.float(), data_range=1.0, reduction="none")


def tile_error_map(candidate: "torch.Tensor", baseline: "torch.Tensor", tile: int = 16) -> "torch.Tensor":
    """Mean absolute error of every ``tile`` x ``tile`` px tile: ``(N, ceil(H/tile), ceil(W/tile))``.

    Edge tiles that do not fill a whole tile are averaged over the pixels they have.
    """
    import torch
    import torch.nn.functional as F

    error = (candidate.float() - baseline.float()).abs().mean(dim=1, keepdim=True)
    ones = torch.ones_like(error)
    pad_h, pad_w = -error.shape[-2] % tile, -error.shape[-1] % tile
    if pad_h or pad_w:
        error, ones = F.pad(error, (0, pad_w, 0, pad_h)), F.pad(ones, (0, pad_w, 0, pad_h))
    sums = F.avg_pool2d(error, tile, divisor_override=1)
    counts = F.avg_pool2d(ones, tile, divisor_override=1)
    return (sums / counts).squeeze(1)


def worst_tile_mae_per_image(candidate: "torch.Tensor", baseline: "torch.Tensor", tile: int = 16) -> "torch.Tensor":
    """The worst tile's mean absolute error, per image."""
    return tile_error_map(candidate, baseline, tile).flatten(1).amax(dim=1)


def rel_l2(candidate: "torch.Tensor", baseline: "torch.Tensor") -> float:
    """``||candidate - baseline|| / ||baseline||`` in float64 (0 for two zero tensors, inf against zero)."""
    diff = (candidate.double() - baseline.double()).norm()
    ref = baseline.double().norm()
    if float(ref) == 0.0:
        return 0.0 if float(diff) == 0.0 else float("inf")
    return float(diff / ref)


def max_abs_error(candidate: "torch.Tensor", baseline: "torch.Tensor") -> float:
    if candidate.numel() == 0:
        return 0.0
    return float((candidate.double() - baseline.double()).abs().max())


def max_rel_error(candidate: "torch.Tensor", baseline: "torch.Tensor") -> float:
    """max ``|c - b| / max(|b|, REL_FLOOR * max|b|)``: relative error that near-zeros cannot blow up."""
    import torch

    if candidate.numel() == 0:
        return 0.0
    b = baseline.double().abs()
    diff = (candidate.double() - baseline.double()).abs()
    scale = float(b.max())
    if scale == 0.0:
        return 0.0 if float(diff.max()) == 0.0 else float("inf")
    return float((diff / torch.clamp(b, min=REL_FLOOR * scale)).max())


def cosine_similarity(candidate: "torch.Tensor", baseline: "torch.Tensor") -> float:
    """Cosine of the flattened tensors in float64 (1 for two zero tensors, 0 when only one is zero)."""
    a, b = candidate.double().flatten(), baseline.double().flatten()
    na, nb = float(a.norm()), float(b.norm())
    if na == 0.0 or nb == 0.0:
        return 1.0 if na == nb else 0.0
    return float((a @ b) / (na * nb))


_ULP_VIEWS = {  # dtype name -> (integer view dtype name, magnitude mask)
    "float64": ("int64", 0x7FFF_FFFF_FFFF_FFFF),
    "float32": ("int32", 0x7FFF_FFFF),
    "float16": ("int16", 0x7FFF),
    "bfloat16": ("int16", 0x7FFF),
    "float8_e4m3fn": ("int8", 0x7F),
    "float8_e5m2": ("int8", 0x7F),
}


def _ordered_bits(tensor: "torch.Tensor") -> "torch.Tensor":
    """Integers that order like the floats, one step per representable value (+0 and -0 coincide)."""
    import torch

    name = torch_name(tensor.dtype)
    view, mask = _ULP_VIEWS[name]
    bits = tensor.contiguous().view(getattr(torch, view)).to(torch.int64)
    magnitude = bits & mask
    return torch.where(bits < 0, -magnitude, magnitude)


def max_ulp(candidate: "torch.Tensor", baseline: "torch.Tensor") -> float:
    """Largest distance in units in the last place of the baseline's dtype (0 means bitwise equal).

    Tensors of different dtypes are ``inf`` apart: a dtype change is never an exact change.
    """
    if candidate.dtype != baseline.dtype:
        return float("inf")
    if candidate.numel() == 0:
        return 0.0
    if not baseline.is_floating_point():
        return float((candidate.to(baseline.dtype).long() - baseline.long()).abs().max())
    name = torch_name(baseline.dtype)
    if name not in _ULP_VIEWS:
        raise DitgateUsageError(f"max_ulp does not know dtype {baseline.dtype}")
    diff = _ordered_bits(candidate).double() - _ordered_bits(baseline).double()
    return float(diff.abs().max())
