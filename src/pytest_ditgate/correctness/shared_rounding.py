"""One rounded value shared by each row: the honest reason a 16-bit output's row can deviate one way.

A softmax whose normaliser is kept in bf16, an RMSNorm whose ``rsqrt`` is, a log-softmax whose log-sum-exp is:
each multiplies (or shifts) a whole row by one value rounded at the inputs' precision, so every element of the
row is off the same way, by up to half an ulp, and the row reads as directed rounding. What tells it from a
truncating cast: the row is *exactly* the correctly rounded value of the exact one times one factor (or plus one
offset), element for element. A truncating cast is not: its error varies with each element's place between two
bf16 values, and no single factor reproduces more than about nine in ten of its elements.

:func:`fit` finds, for each row (the slices along the last dim), the factor and the offset that reproduce the
most of its elements (the point covered by the most of the elements' intervals of factors that round to the
candidate's value), keeps the better, and counts per region the elements it reproduces. A region is explained
where :data:`EXPLAINED_SHARE` of its judged elements are, with each row's factor within one ulp of 1 (its offset
within one ulp of the row's largest value) and at least :data:`MIN_ROW_ELEMENTS` judged elements in the row. One more condition keeps a scale out: a rounded value errs either
way from row to row, so where :data:`MIN_ROWS_FOR_SIGNS` or more rows are shifted noticeably and nearly all the
same way (four standard deviations of a fair coin), it is a scale (0.1 % low everywhere, a wrong eps), and
nothing is explained.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from pytest_ditgate.correctness import compare

#: share of a region's judged elements one factor (or offset) per row must reproduce exactly (a shared rounded
#: value: all but a few near ties; a truncating cast: about nine in ten at the best factor)
EXPLAINED_SHARE = 0.99
#: from this many noticeably shifted rows on, their directions must not all go one way
MIN_ROWS_FOR_SIGNS = 16
#: a row's shift counts as noticeable from this fraction of an ulp on
NOTICEABLE = 1 / 16
#: a row with fewer judged elements explains nothing (one factor reproduces two or three elements of any rounding)
MIN_ROW_ELEMENTS = 32
#: the intervals of values that round to an output value reach this fraction of a spacing past its midpoints
_HAIR = 2.0 ** -20


@dataclass
class Fit:
    """Per partition (by index, as :func:`pytest_ditgate.correctness.rounding` lists them), the judged and the
    reproduced elements of each region; and whether the rows' shifts go both ways."""

    judged: list[torch.Tensor]
    explained: list[torch.Tensor]
    balanced: bool
    note: str | None = None  # why nothing is explained, where that is the signs
    spread: bool = False  # MIN_ROWS_FOR_SIGNS or more rows shifted noticeably, both ways (see :func:`fit`)

    def excuses(self, partition: int, region: int) -> bool:
        judged = float(self.judged[partition][region])
        return self.balanced and judged > 0 and float(self.explained[partition][region]) >= EXPLAINED_SHARE * judged


def fit(output: torch.Tensor, reference: torch.Tensor, partitions: list[Any], max_error_ulp: float = 1.0) -> Fit:
    """The best factor and offset per row of ``output`` (16-bit) against ``reference`` (exact), and per region of
    each of ``partitions`` (objects with ``regions`` and ``region_of(flat, width)``) the elements they reproduce,
    out of those within ``max_error_ulp`` of the exact value (the elements the rounding test judged: a row
    scaled by 2 %, whose errors are a few ulps, counts unexplained)."""
    width = output.shape[-1] if output.dim() else 1
    rows = output.numel() // max(width, 1)
    eps = torch.finfo(output.dtype).eps
    judged = [torch.zeros(part.regions, dtype=torch.float64, device=output.device) for part in partitions]
    explained = [torch.zeros_like(j) for j in judged]
    signs = {"factor": [0, 0], "offset": [0, 0]}
    shifts = {"factor": [0, 0], "offset": [0, 0]}  # rows whose mean error beyond round-to-nearest's leans, by kind
    flat_out, flat_ref = output.detach().reshape(rows, width), reference.detach().reshape(rows, width)
    step = max(1, compare.CHUNK // 4 // max(width, 1))
    for first in range(0, rows, step):
        got = flat_out[first:first + step].to(torch.float64)
        exact = flat_ref[first:first + step].to(torch.float64, copy=True).to(got.device)
        keep = judged_elements(got, exact, output.dtype, max_error_ulp)
        best, kind, value = _best_rows(got, exact, keep, output.dtype)
        bound = torch.where(kind == 0, torch.full_like(value, eps),
                            eps * exact.abs().masked_fill(~keep, 0).amax(dim=1))
        shift = torch.where(kind == 0, value - 1, value)
        fits = (shift.abs() <= bound) & (keep.sum(dim=1) >= MIN_ROW_ELEMENTS)
        best &= fits[:, None]
        noticeable = fits & (shift.abs() >= NOTICEABLE * bound)
        for code, name in ((0, "factor"), (1, "offset")):
            chosen = noticeable & (kind == code)
            signs[name][0] += int((chosen & (shift > 0)).sum())
            signs[name][1] += int((chosen & (shift < 0)).sum())
        _count_shifts(got, exact, keep, output.dtype, shifts)
        index = (torch.arange(got.shape[0], device=got.device)[:, None] + first) * width \
            + torch.arange(width, device=got.device)[None, :]
        for number, part in enumerate(partitions):
            region = part.region_of(index[keep], width)
            judged[number].index_add_(0, region, torch.ones_like(region, dtype=torch.float64))
            explained[number].index_add_(0, region, best[keep].to(torch.float64))
    for name, (up, down) in signs.items():
        shifted = up + down
        if shifted >= MIN_ROWS_FOR_SIGNS and max(up, down) >= (0.5 + 2 / math.sqrt(shifted)) * shifted:
            return Fit(judged, explained, False, f"{max(up, down)} of the {shifted} rows that one {name} each shifts "
                       "noticeably go the same way: a scale, not a value rounded per row (which errs either way)")
    return Fit(judged, explained, True, spread=_spread(shifts))


def spread(output: torch.Tensor, reference: torch.Tensor, max_error_ulp: float = 1.0) -> bool:
    """Whether :data:`MIN_ROWS_FOR_SIGNS` or more rows of ``output`` (slices along its last dim; pass a
    transposed view for columns) lean noticeably beyond round-to-nearest, both ways as a fair coin would: values
    shared by a line, rounded, then used in more roundings (a bias or gate added op by op in bf16 shifts each
    column by that value's place between two bf16 values, up or down)."""
    width = output.shape[-1] if output.dim() else 1
    rows = output.numel() // max(width, 1)
    flat_out, flat_ref = output.detach().reshape(rows, width), reference.detach().reshape(rows, width)
    step = max(1, compare.CHUNK // 4 // max(width, 1))
    shifts = {"factor": [0, 0], "offset": [0, 0]}
    for first in range(0, rows, step):
        got = flat_out[first:first + step].to(torch.float64)
        exact = flat_ref[first:first + step].to(torch.float64, copy=True).to(got.device)
        keep = judged_elements(got, exact, output.dtype, max_error_ulp)
        _count_shifts(got, exact, keep, output.dtype, shifts)
    return _spread(shifts)


def _spread(shifts: dict[str, list[int]]) -> bool:
    """Enough leaning rows, and neither kind of lean (factor, offset) nearly all one way."""
    leaning = sum(up + down for up, down in shifts.values())
    return leaning >= MIN_ROWS_FOR_SIGNS and all(
        max(up, down) < (0.5 + 2 / math.sqrt(up + down)) * (up + down) for up, down in shifts.values() if up + down)


def _count_shifts(got: torch.Tensor, exact: torch.Tensor, keep: torch.Tensor, dtype: torch.dtype,
                  shifts: dict[str, list[int]]) -> None:
    """Count the rows whose mean error beyond round-to-nearest's leans by :data:`NOTICEABLE` of an ulp or more,
    up or down, as a factor (against the exact value's sign) or an offset (against +inf), whichever leans more.
    A value rounded per row and then used in more roundings (an op-by-op bf16 LayerNorm: its mean and ``rsqrt``
    rounded, then each element) shifts its row by up to half an ulp without reproducing it exactly, and shifts
    the rows both ways."""
    beyond = beyond_nearest(got, exact, dtype)
    count = keep.sum(dim=1).clamp(min=1)
    offset = beyond.masked_fill(~keep, 0).sum(dim=1) / count
    factor = (beyond * torch.sign(exact)).masked_fill(~keep, 0).sum(dim=1) / count
    enough = keep.sum(dim=1) >= MIN_ROW_ELEMENTS
    use_factor = factor.abs() >= offset.abs()
    for name, lean, chosen in (("factor", factor, use_factor), ("offset", offset, ~use_factor)):
        counted = enough & chosen & (lean.abs() >= NOTICEABLE)
        shifts[name][0] += int((counted & (lean > 0)).sum())
        shifts[name][1] += int((counted & (lean < 0)).sum())


def beyond_nearest(got: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Each element's error beyond round-to-nearest's, in ulps of ``dtype`` at the exact value (float64)."""
    ulp = compare.spacing(exact.abs(), dtype)
    return ((got - exact) - (exact.to(dtype).to(torch.float64) - exact)) / ulp


def judged_elements(got: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype,
                    max_error_ulp: float) -> torch.Tensor:
    """The elements a row's fit counts: finite, in the dtype's normal range, within ``max_error_ulp`` of the exact
    value, on its side of zero."""
    info = torch.finfo(dtype)
    size = exact.abs()
    return (torch.isfinite(exact) & torch.isfinite(got) & (size >= info.tiny) & (size <= info.max)
            & ((got - exact).abs() <= max_error_ulp * compare.spacing(size, dtype))
            & (torch.sign(got) == torch.sign(exact)))


def _best_rows(got: torch.Tensor, exact: torch.Tensor, keep: torch.Tensor,
               dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row the better of one factor and one offset: which elements it reproduces ``(rows, width)``, the model
    (0 factor, 1 offset) and its value."""
    magnitude = got.abs()
    # what rounds to ``got``: half a spacing either way (half as far below a power of two), the ends widened by a
    # hair so that a tie computed exactly (the difference of two bf16 values often is one) stays inside
    above = compare.spacing(magnitude, dtype) * (0.5 + _HAIR)  # toward larger magnitude
    below = compare.spacing(magnitude * (1 - 2.0 ** -20), dtype) * (0.5 + _HAIR)
    low_value = torch.where(got > 0, got - below, got - above)
    high_value = torch.where(got > 0, got + above, got + below)
    factor = _best_point((magnitude - below) / exact.abs(), (magnitude + above) / exact.abs(), keep)
    offset = _best_point(low_value - exact, high_value - exact, keep)
    use_offset = offset[0].sum(dim=1) > factor[0].sum(dim=1)
    best = torch.where(use_offset[:, None], offset[0], factor[0])
    return best, use_offset.to(torch.int64), torch.where(use_offset, offset[1], factor[1])


def _best_point(low: torch.Tensor, high: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row the point inside the most of the closed intervals ``[low, high]`` of its kept elements: which
    intervals hold it ``(rows, width)``, and the point. Elements not kept take the whole line and are not
    counted."""
    low = low.masked_fill(~keep, -math.inf)
    high = high.masked_fill(~keep, math.inf)
    starts, ends = low.sort(dim=1).values, high.sort(dim=1).values
    cover = torch.searchsorted(starts, starts, right=True) - torch.searchsorted(ends, starts)
    cover.masked_fill_(starts == -math.inf, -1)
    best = cover.argmax(dim=1, keepdim=True)
    left = starts.gather(1, best)
    next_end = ends.gather(1, torch.searchsorted(ends, left).clamp(max=ends.shape[1] - 1))
    next_start = starts.gather(1, torch.searchsorted(starts, left, right=True).clamp(max=starts.shape[1] - 1))
    right = torch.minimum(next_end, torch.where(next_start > left, next_start, next_end))
    point = torch.where(torch.isfinite(right), (left + right) / 2, left)
    return (low <= point) & (point <= high) & keep, point[:, 0]
