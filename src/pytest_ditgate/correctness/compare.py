"""Tensor comparisons for the correctness gate: errors against the reference, exact equality, upcasting.

Every full-size comparison runs over flat chunks of :data:`CHUNK` elements, widened to float64 one chunk at
a time: a check of a 4096 x 128256 output holds a few chunk-sized temporaries, never a dozen float64 copies
of the whole output (which is what made a 1 GB input run out of memory).
"""

from __future__ import annotations

import math
from typing import Any, Iterator

import torch

from pytest_ditgate.correctness.report import HonestBound, OutputComparison, TensorDesc
from pytest_ditgate.correctness.tolerances import Tolerance
from pytest_ditgate.dtypes import dtype_name

#: elements per chunk of a full-size comparison (8 MB per float64 temporary)
CHUNK = 1 << 22


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


def _wide(tensor: torch.Tensor, *, copy: bool = False) -> torch.Tensor:
    """``tensor`` in float64 (complex128); ``copy``: always a new tensor, safe to change in place."""
    return tensor.detach().to(torch.complex128 if tensor.is_complex() else torch.float64, copy=copy)


def chunks(*tensors: torch.Tensor, device: Any = None) -> Iterator[tuple[int, list[torch.Tensor]]]:
    """``(start, [flat chunk of each tensor])`` over tensors of equal size, on ``device`` (default: the first
    tensor's). A non-contiguous tensor is flattened once, in its own dtype."""
    device = tensors[0].device if device is None else device
    flats = [t.detach().reshape(-1) for t in tensors]
    for start in range(0, flats[0].numel(), CHUNK):
        yield start, [f[start:start + CHUNK].to(device) for f in flats]


def max_difference(a: torch.Tensor, b: torch.Tensor, *, cast: bool = False) -> float:
    """Largest |a - b| treating NaN==NaN and equal infinities as equal; inf when they differ otherwise.
    With ``cast``, ``a`` is rounded to ``b``'s dtype first (an upcast copy against its pristine original)."""
    if a.shape != b.shape:
        return float("inf")
    if a.numel() == 0:
        return 0.0
    if a.dtype == b.dtype and a.device == b.device and torch.equal(a, b):
        return 0.0  # the common case, without widening copies
    worst = 0.0
    for _, (ca, cb) in chunks(a, b):
        if cast and ca.dtype != cb.dtype:
            ca = ca.to(cb.dtype)
        wa, wb = _wide(ca), _wide(cb)
        same = (wa == wb) | (wa.isnan() & wb.isnan())
        if bool(same.all()):
            continue
        diff = (wa - wb).abs().masked_fill(same, 0)
        worst = max(worst, float(diff.nan_to_num(nan=float("inf")).max()))
    return worst


def first_where(tensor: torch.Tensor, mask_of: Any) -> tuple[int, tuple[int, ...] | None]:
    """``(count, index of the first)`` of the elements where ``mask_of(flat chunk, start)`` is True."""
    count, first = 0, None
    for start, (chunk,) in chunks(tensor):
        mask = mask_of(chunk, start)
        found = int(mask.sum())
        if found and first is None:
            first = _unravel(start + int(mask.nonzero()[0, 0]), tuple(tensor.shape))
        count += found
    return count, first


def nonfinite_where_reference_finite(candidate: torch.Tensor,
                                     reference: torch.Tensor) -> tuple[int, tuple[int, ...] | None]:
    """``(count, first index)`` of elements non-finite in the candidate but finite in the reference (zero for
    exact dtypes)."""
    if not is_inexact(candidate):
        return 0, None
    flat_reference = reference.detach().reshape(-1)

    def mask(chunk: torch.Tensor, start: int) -> torch.Tensor:
        ref = flat_reference[start:start + chunk.numel()].to(chunk.device)
        return ~torch.isfinite(chunk) & torch.isfinite(ref)

    return first_where(candidate, mask)


def fingerprint(tensor: torch.Tensor) -> tuple[Any, ...]:
    """A small summary equal for equal tensors (shape, dtype, float64 sums of the values and their squares,
    NaN count, a few values): what the constant-output check keeps of an earlier trial's output instead of
    the output itself. Two different outputs share one only by an exact coincidence of all of them."""
    total = squares = 0.0
    nans = 0
    for _, (chunk,) in chunks(tensor):
        wide = _wide(chunk)
        if wide.is_complex():
            wide = torch.view_as_real(wide)
        nans += int(wide.isnan().sum())
        wide = wide.nan_to_num(nan=0.0, posinf=1e308, neginf=-1e308)
        total += float(wide.sum())
        squares += float((wide / 1e154).pow(2).sum())  # scaled: the squares of huge values stay finite
    picks = ()
    if tensor.numel():
        flat = tensor.detach().reshape(-1)
        positions = sorted({0, flat.numel() // 3, flat.numel() // 2, flat.numel() - 1})
        picks = tuple(str(flat[p].item()) if not dtype_name(tensor.dtype).startswith("float8")
                      else str(flat[p].float().item()) for p in positions)
    return tuple(tensor.shape), str(tensor.dtype), total, squares, nans, picks


def norm(tensor: torch.Tensor) -> float:
    """``||tensor||`` over its finite elements, in float64."""
    total = 0.0
    for _, (chunk,) in chunks(tensor):
        wide = _wide(chunk)
        total += float(torch.where(torch.isfinite(wide), wide, 0).abs().pow(2).sum())
    return math.sqrt(total)


def gap_norm(other: torch.Tensor, reference: torch.Tensor, *, absolute: bool = False,
             cast: torch.dtype | None = None) -> float | None:
    """``||other - reference||`` over the reference's finite elements (``||other||`` there when
    ``absolute``; ``other`` rounded to ``cast`` first when given); None when ``other`` is non-finite where
    the reference is finite."""
    total = 0.0
    for _, (o, r) in chunks(other, reference, device=reference.device):
        if cast is not None:
            o = o.to(cast)
        o, r = _wide(o), _wide(r)
        finite = torch.isfinite(r)
        if not bool(torch.isfinite(o)[finite].all()):
            return None
        total += float(torch.where(finite, o if absolute else o - r, 0).abs().pow(2).sum())
    return math.sqrt(total)


def local_scale(magnitude: torch.Tensor | None, reference: torch.Tensor) -> tuple[torch.Tensor, float] | None:
    """``(|f(|x|)|, factor)``: the size of the terms each output element is made of, and the factor that
    brings it to the reference's RMS, in the units of the output (None when the magnitude run is missing,
    shaped otherwise or zero)."""
    if magnitude is None or tuple(magnitude.shape) != tuple(reference.shape):
        return None
    ref_sq = mag_sq = 0.0
    for _, (r, m) in chunks(reference, magnitude):
        r, m = _wide(r).abs(), _wide(m).abs()
        usable = torch.isfinite(r) & torch.isfinite(m)
        ref_sq += float(torch.where(usable, r, 0).pow(2).sum())
        mag_sq += float(torch.where(usable, m, 0).pow(2).sum())
    if mag_sq == 0 or not math.isfinite(mag_sq):
        return None
    return magnitude.detach(), math.sqrt(ref_sq / mag_sq)


def compare_output(name: str, candidate: torch.Tensor, reference: torch.Tensor, tolerance: Tolerance,
                   honest: HonestBound | None = None, local: tuple[torch.Tensor, float] | None = None,
                   spread: torch.Tensor | None = None) -> OutputComparison:
    """Elementwise and relative-norm errors of ``candidate`` against ``reference`` (same shape).

    The norm bound is ``honest.bound`` (the table's ``rel_norm`` without an estimate). An element may err by
    ``atol + rtol*|ref|`` or by ``rule.elementwise`` x that bound x (|ref| + its scale), whichever is larger.
    Its scale is the output's mean magnitude, or the size of its own terms where that is larger (``local``,
    from :func:`local_scale`): only errors concentrated on a few elements fail elementwise, errors spread
    evenly over elements of one size are the norm's to judge. The table's ``atol`` is relative to the
    output's mean magnitude (an absolute 1.6e-2 would pass any bf16 output whose elements are all smaller);
    an ``atol`` the caller gives is absolute. An element may always differ by the spacing of the output's
    dtype at the reference's value (no kernel rounds nearer; in fp16's subnormal range it is 6e-8), and, once
    the conditioning is measured, by ``rule.conditioning`` x its own simulated rounding error (``spread``).
    """
    honest = honest if honest is not None else HonestBound.table_only(tolerance.rel_norm)
    result = OutputComparison(name=name, shape=tuple(candidate.shape),
                              dtype=dtype_name(candidate.dtype), reference_dtype=dtype_name(reference.dtype),
                              tolerance=tolerance, numel=candidate.numel(), honest=honest)
    if candidate.numel() == 0:
        return result
    device = candidate.device
    mean = _mean_magnitude(reference, device)
    atol = tolerance.atol * mean if tolerance.atol_relative else tolerance.atol
    factor = honest.rule.elementwise * honest.bound
    result.atol_used, result.scale = atol, mean
    result.local_scale, result.conditioned = local is not None, spread is not None
    parts = [candidate, reference] + ([local[0]] if local is not None else []) + \
        ([spread] if spread is not None else [])
    zero = torch.zeros((), dtype=torch.float64, device=device)
    inf = torch.full((), float("inf"), dtype=torch.float64, device=device)
    ulp = None
    if candidate.is_floating_point() and not tolerance.exact:
        info = torch.finfo(candidate.dtype)
        ulp = (info.eps, info.tiny)
    stats: dict[str, list[torch.Tensor]] = {key: [] for key in ("bad", "ratio", "abs", "rel", "err", "ref", "ok",
                                                                "scaled")}
    worst_excess: list[tuple[torch.Tensor, torch.Tensor, int]] = []
    worst_diff: list[tuple[torch.Tensor, torch.Tensor, int]] = []
    for start, flat in chunks(*parts, device=device):
        c, r = _wide(flat[0], copy=True), _wide(flat[1], copy=True)  # fresh: changed in place below
        finite = torch.isfinite(c).logical_and_(torch.isfinite(r))
        if bool(finite.all()):  # the usual chunk: in place, few temporaries (complex abs is out of place)
            stats["ok"].append(finite.all())
            diff = c.sub_(r).abs() if c.is_complex() else c.sub_(r).abs_()
            size = r.abs() if r.is_complex() else r.abs_()
        else:
            both_special = ~finite & ((c == r) | (c.isnan() & r.isnan()))  # same inf, or NaN beside the ref's NaN
            stats["ok"].append((finite | both_special).all())
            diff = torch.where(finite, (c - r).abs(), zero)
            diff = torch.where(finite | both_special, diff, inf)
            size = torch.where(finite, r.abs(), zero)
            del c, r, both_special
        stats["err"].append(torch.linalg.vector_norm(torch.where(finite, diff, zero)).square())
        stats["ref"].append(torch.linalg.vector_norm(size).square())
        del finite
        allowed = size * tolerance.rtol + atol
        if local is None:
            bound = (size + mean).mul_(factor)
        else:
            bound = _wide(flat[2]).abs().nan_to_num_(nan=0.0, posinf=0.0).mul_(local[1]).clamp_(min=mean)
            bound.add_(size).mul_(factor)
        torch.maximum(allowed, bound, out=allowed)
        del bound
        if ulp is not None:  # no output is nearer than its dtype's spacing at the value (subnormals)
            torch.maximum(allowed, _spacing(size, *ulp), out=allowed)
        if spread is not None:  # the element's own conditioning (its simulated rounding error)
            torch.maximum(allowed, flat[-1].double() * honest.rule.conditioning, out=allowed)
        stats["bad"].append((diff > allowed).sum())
        stats["scaled"].append((diff / (size + mean)).nan_to_num_(nan=0.0).max())
        stats["abs"].append(diff.max())
        exact = diff == 0
        stats["ratio"].append((diff / allowed).masked_fill_(exact, 0).nan_to_num_(nan=float("inf")).max())
        stats["rel"].append((diff / size).masked_fill_(exact, 0).nan_to_num_(nan=float("inf")).max())
        for store, values in ((worst_excess, diff - allowed), (worst_diff, diff)):
            best, at = values.nan_to_num(nan=float("inf")).max(dim=0)  # new 0-d tensors: the chunk is freed
            store.append((best, at, start))
    result.mismatches = int(torch.stack(stats["bad"]).sum())
    result.elementwise_ratio = float(torch.stack(stats["ratio"]).max())
    result.max_abs = float(torch.stack(stats["abs"]).max())
    result.max_rel = float(torch.stack(stats["rel"]).max())
    result.scaled_error = float(torch.stack(stats["scaled"]).max())
    ref_norm = math.sqrt(float(torch.stack(stats["ref"]).sum()))
    err_norm = math.sqrt(float(torch.stack(stats["err"]).sum()))
    if not bool(torch.stack(stats["ok"]).all()):
        result.rel_norm = float("inf")
    elif ref_norm == 0:
        result.rel_norm = 0.0 if err_norm == 0 else float("inf")
    else:
        result.rel_norm = err_norm / ref_norm
    store = worst_excess if result.mismatches else worst_diff
    best = max(range(len(store)), key=lambda i: float(store[i][0]))
    index = _unravel(store[best][2] + int(store[best][1]), tuple(candidate.shape))
    result.worst_index = index
    result.worst_candidate = _item(candidate, index)
    result.worst_reference = _item(reference, index)
    return result


def spacing(size: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The distance between neighbouring values of the floating ``dtype`` at the magnitudes ``size``."""
    info = torch.finfo(dtype)
    return _spacing(size, info.eps, info.tiny)


def _spacing(size: torch.Tensor, eps: float, tiny: float) -> torch.Tensor:
    """The distance between neighbouring values of a dtype (machine epsilon ``eps``, smallest normal ``tiny``)
    at ``size``: ``eps * 2**floor(log2(size))``, the subnormal spacing below ``tiny``."""
    _, exponent = torch.frexp(torch.clamp(size, min=tiny))
    return torch.ldexp(torch.full_like(size, eps), exponent - 1)


def _mean_magnitude(reference: torch.Tensor, device: Any) -> float:
    """Mean of ``|ref|`` over the output (non-finite elements count as zero): the output's own magnitude."""
    total = 0.0
    for _, (r,) in chunks(reference, device=device):
        total += float(_wide(r).abs().nan_to_num(nan=0.0, posinf=0.0).sum())
    return total / reference.numel()


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        index.append(flat % size if size else 0)
        flat = flat // size if size else 0
    return tuple(reversed(index))


def _item(tensor: torch.Tensor, index: tuple[int, ...]) -> Any:
    value = tensor[index] if index else tensor
    if dtype_name(value.dtype).startswith("float8"):
        value = value.float()
    return value.item()
