"""Tensor comparisons for the correctness gate: errors against the reference, exact equality, upcasting."""

from __future__ import annotations

from typing import Any

import torch

from pytest_ditgate.correctness.report import HonestBound, OutputComparison, TensorDesc
from pytest_ditgate.correctness.tolerances import Tolerance
from pytest_ditgate.dtypes import dtype_name


def describe(name: str, tensor: torch.Tensor) -> TensorDesc:
    return TensorDesc(name=name, shape=tuple(tensor.shape), dtype=dtype_name(tensor.dtype),
                      strides=tuple(tensor.stride()), contiguous=tensor.is_contiguous(), device=str(tensor.device))


def is_inexact(tensor: torch.Tensor) -> bool:
    return tensor.is_floating_point() or tensor.is_complex()


def upcast(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """A fresh copy of ``tensor``; floating (complex) ones in ``dtype`` (its complex twin); None keeps dtype."""
    if dtype is None or not is_inexact(tensor):
        return tensor.detach().clone()
    if tensor.is_complex():
        dtype = torch.complex128 if dtype == torch.float64 else torch.complex64
    return tensor.detach().to(dtype=dtype, copy=True)


def _wide(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to(torch.complex128 if tensor.is_complex() else torch.float64)


def max_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b| treating NaN==NaN and equal infinities as equal; inf when they differ otherwise."""
    if a.shape != b.shape:
        return float("inf")
    if a.numel() == 0:
        return 0.0
    if a.dtype == b.dtype and a.device == b.device and torch.equal(a, b):
        return 0.0  # the common case, without widening copies
    wa, wb = _wide(a), _wide(b.to(a.device))
    same = (wa == wb) | (wa.isnan() & wb.isnan())
    if bool(same.all()):
        return 0.0
    diff = (wa - wb).abs().masked_fill(same, 0)
    return float(diff.nan_to_num(nan=float("inf")).max())


def nonfinite_where_reference_finite(candidate: torch.Tensor, reference: torch.Tensor) -> torch.Tensor | None:
    """Mask of elements non-finite in the candidate but finite in the reference (None for exact dtypes)."""
    if not is_inexact(candidate):
        return None
    return ~torch.isfinite(candidate) & torch.isfinite(reference.to(candidate.device))


def compare_output(name: str, candidate: torch.Tensor, reference: torch.Tensor, tolerance: Tolerance,
                   honest: HonestBound | None = None) -> OutputComparison:
    """Elementwise and relative-norm errors of ``candidate`` against ``reference`` (same shape).

    The norm bound is ``honest.bound`` (the table's ``rel_norm`` without an estimate). An element may err by
    ``atol + rtol*|ref|`` or by ``rule.elementwise`` x that bound x (|ref| + rms(ref)), whichever is larger:
    only errors concentrated on a few elements fail elementwise, errors spread evenly are the norm's to judge.
    """
    honest = honest if honest is not None else HonestBound.table_only(tolerance.rel_norm)
    result = OutputComparison(name=name, shape=tuple(candidate.shape),
                              dtype=dtype_name(candidate.dtype), reference_dtype=dtype_name(reference.dtype),
                              tolerance=tolerance, numel=candidate.numel(), honest=honest)
    if candidate.numel() == 0:
        return result
    c, r = _wide(candidate), _wide(reference.to(candidate.device))
    finite = torch.isfinite(c) & torch.isfinite(r)
    both_special = ~finite & ((c == r) | (c.isnan() & r.isnan()))  # same inf, or NaN where the reference has NaN
    diff = torch.where(finite, (c - r).abs(), torch.zeros((), dtype=torch.float64, device=c.device))
    inf = torch.full((), float("inf"), dtype=torch.float64, device=c.device)
    diff = torch.where(finite | both_special, diff, inf)
    size = torch.where(finite, r.abs(), 0)
    rms = float(size.pow(2).mean().sqrt())
    allowed = torch.maximum(tolerance.atol + tolerance.rtol * size,
                            honest.rule.elementwise * honest.bound * (size + rms))
    bad = diff > allowed
    ratio = torch.where(diff == 0, 0.0, diff / allowed).nan_to_num(nan=float("inf"))
    result.elementwise_ratio = float(ratio.max())
    result.mismatches = int(bad.sum())
    result.max_abs = float(diff.max())
    rel = diff / r.abs()
    rel = torch.where(diff == 0, torch.zeros((), dtype=torch.float64, device=c.device), rel)
    rel = rel.nan_to_num(nan=float("inf"))
    result.max_rel = float(rel.max())
    ref_norm = float(torch.where(finite, r, 0).abs().norm())
    err_norm = float(torch.where(finite, diff, 0).norm())
    if not bool((finite | both_special).all()):
        result.rel_norm = float("inf")
    elif ref_norm == 0:
        result.rel_norm = 0.0 if err_norm == 0 else float("inf")
    else:
        result.rel_norm = err_norm / ref_norm
    excess = (diff - allowed) if result.mismatches else diff
    flat = int(torch.argmax(excess.nan_to_num(nan=float("inf")).reshape(-1)))
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(candidate.shape))) \
        if candidate.dim() else ()
    result.worst_index = index
    result.worst_candidate = _item(candidate, index)
    result.worst_reference = _item(reference, index)
    return result


def _item(tensor: torch.Tensor, index: tuple[int, ...]) -> Any:
    value = tensor[index] if index else tensor
    if dtype_name(value.dtype).startswith("float8"):
        value = value.float()
    return value.item()
