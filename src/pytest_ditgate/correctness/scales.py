"""Extremal trials: the inputs of a trial scaled far from unit variance, as OpInfo's extremal samples do.

Inputs drawn with unit variance hide what only shows at other magnitudes: an RMSNorm with eps 1e-2 instead
of 1e-6 passes bf16 at unit scale, and squares that overflow fp16 or underflow to subnormals never happen.
After its ``trials``, ``check_kernel`` runs one trial per entry of ``input_scales`` (default
:data:`DEFAULT_SCALES`): trial ``k``'s inputs (seed ``seed + k``) with every floating input (or those named
in ``scaled_args``) multiplied by the scale, or, for ``"mixed"``, each row (the slices along the last
dimension) by its own factor, log-uniform in [1e-3, 1e3]. Scaling keeps signs, so an input's sign domain
(positive for ``log``, ``sqrt``, a variance) is kept.

Where the op does not allow a scale, its trial is skipped with a note in the report, never failed: when a
scaled input overflows its dtype, when the float64 reference is non-finite, or when the reference's
output overflows the dtype the candidate returns. ``input_scales=()`` turns the trials off;
``input_scales=(1e-2, 1e2)`` declares the range an op is valid over.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from pytest_ditgate.arguments import describe
from pytest_ditgate.errors import DitgateUsageError

MIXED = "mixed"
DEFAULT_SCALES: tuple[float | str, ...] = (1e-3, 1e3, MIXED)
#: the decades a "mixed" trial's row factors span, either side of 1
MIXED_DECADES = 3.0


def parse_scales(value: Any, call: str) -> tuple[float | str, ...]:
    """``input_scales``: a tuple of positive finite numbers and ``"mixed"``; () or None for none."""
    if value is None:
        return ()
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise DitgateUsageError(f"{call}: input_scales must be a tuple of positive numbers and 'mixed' (like "
                                f"(1e-3, 1e3, 'mixed')), or () for none, got {describe(value)}")
    for scale in value:
        if scale == MIXED:
            continue
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
            raise DitgateUsageError(f"{call}: input_scales entries are positive finite numbers or 'mixed', got "
                                    f"{describe(scale)}")
    return tuple(float(s) if s != MIXED else MIXED for s in value)


def scale_text(scale: float | str) -> str:
    """How a trial's scale reads in messages."""
    from pytest_ditgate.correctness.report import _scale_text

    return _scale_text(scale)


def scaled(value: Any, scale: float | str, seed: int, wanted: Callable[[str], bool], name: str = "") -> Any:
    """``value`` (a call's args or kwargs, nested) with each floating tensor whose top-level name ``wanted``
    accepts replaced by a scaled copy in the same layout; raises ``OverflowError`` naming a tensor that the
    scale makes non-finite in its dtype."""
    import torch

    from pytest_ditgate.correctness.roles import copy_like

    def visit(item: Any, path: str, top: str) -> Any:
        if isinstance(item, torch.Tensor):
            if not (item.is_floating_point() and wanted(top)):
                return item
            return copy_like(item, _scaled_values(item, scale, seed, path))
        if isinstance(item, dict):
            return type(item)((k, visit(v, f"{path}[{k!r}]" if path else str(k), top or str(k)))
                              for k, v in item.items())
        if isinstance(item, (tuple, list)):
            parts = [visit(v, f"{path}[{i}]" if path else f"arg{i}", top or f"arg{i}") for i, v in enumerate(item)]
            return type(item)(*parts) if hasattr(item, "_fields") else type(item)(parts)
        return item

    return visit(value, name, "")


def _scaled_values(tensor: Any, scale: float | str, seed: int, name: str) -> Any:
    import torch

    # in the tensor's own precision (at least fp32): no float64 copy of a large input
    wide = tensor.detach().float() if tensor.dtype.itemsize < 4 else tensor.detach()
    if scale == MIXED:
        generator = torch.Generator(tensor.device).manual_seed(int(seed) * 7919 + len(name))
        rows = tuple(tensor.shape[:-1]) + (1,) if tensor.dim() else ()
        decades = torch.rand(rows, dtype=torch.float64, device=tensor.device, generator=generator) * 2 - 1
        wide = wide * torch.pow(10.0, decades * MIXED_DECADES).to(wide.dtype)
    else:
        wide = wide * scale
    out = wide.to(tensor.dtype)
    if bool((torch.isfinite(tensor) & ~torch.isfinite(out)).any()):
        raise OverflowError(f"input {name} overflows {str(tensor.dtype).removeprefix('torch.')} at this scale")
    return out
