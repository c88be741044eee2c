"""Directed rounding in 16-bit outputs: a kernel that rounds one way (a truncating cast, round toward -inf, a
one-signed approximation) stays within one ulp, so any tolerance passes it, yet it shifts every output the same
way, and such shifts add up through a network's layers where round-to-nearest errors cancel.

The test compares the candidate with the correctly rounded reference (round to nearest, even on ties), element
by element, where the exact value is not representable, is no tie, and the candidate's error is within
:data:`MAX_ERROR_ULP` ulps (larger errors are the computation's, judged by the tolerance): a scale of 1-3 % on a
few rows or columns leaves errors of a few ulps one way, within bf16's elementwise allowance and diluted in the
norm, while an honest kernel's errors beyond one rounding (cancellation, op-by-op roundings) go either way. A
kernel that rounds to nearest from a more precise result deviates from that only near ties, either way; double
rounding (an intermediate in bf16) and stochastic rounding deviate either way too. A directed one deviates one
way, and its mean error in that way exceeds round-to-nearest's.

The test runs over the whole output and over regions of it: blocks of rows and blocks of columns of its last two
dims (the leading dims count as rows), each of about :data:`REGION_ELEMENTS` elements, so that a directed rounding
confined to part of the output (the last tile's columns, the last rows) is not averaged away by the rest. A region
needs more deviations and a larger share one way than the whole output (many regions: some honest ones lean by
chance), and the same mean error beyond round-to-nearest's.

A bias the reference's own run at the inputs' precision shows too (a value shared by a row and rounded at that
precision shifts the row one way) is excused in the same region, up to :data:`EXCUSE_FACTOR` times the reference's
own plus :data:`EXCUSE_MARGIN_ULP` (the reference's op-by-op roundings blur its shift a little). The reference's
bias counts in the same direction or the opposite one (toward zero against away from zero, toward -inf against
toward +inf): a shared value near a rounding tie rounds one way in the kernel and the other in the reference's run
(about one row in a hundred), shifting the row by as much the other way. Its size is what excuses: a bias the
precision does not explain (a truncating cast's 0.5 ulp where the reference's run errs 0.05) is not excused.
A region whose rows are each exactly one factor (or offset) from the correctly rounded reference, the rows' shifts
going both ways, is excused too: one value per row rounded where the reference does not round it
(:mod:`pytest_ditgate.correctness.shared_rounding`); and so is a block of rows (of columns) leaning up to
:data:`SHARED_SHIFT_ULP` where the output's rows (columns) lean both ways (values rounded per row, a bias added
per column after another rounding), and up to :data:`OFFSET_SHIFT_ULP` where the lean does not grow with the
value as a scale's does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from pytest_ditgate.correctness import compare, shared_rounding

#: output dtypes whose rounding is judged (a 32-bit output's error is its computation's, not its rounding's)
ROUNDED_DTYPES = (torch.bfloat16, torch.float16)
#: fewer deviations from round-to-nearest than this say nothing about a direction
MIN_DEVIATIONS = 32
#: at least this share of the deviations go one way (honest kernels: about half; the bound also stays 4
#: standard deviations of a fair coin above one half)
MIN_SHARE = 0.85
#: and the candidate's mean error against the exact values, in that direction, is at least this many ulps, and
#: exceeds round-to-nearest's by as much (a truncating cast: 0.5 and 0.5; where the exact values sit on one side
#: of the midpoints, round-to-nearest itself errs one way, and stochastic rounding, which then deviates one way,
#: errs less)
MIN_BIAS_ULP = 0.1
#: elements whose error is at most this many ulps are judged: one rounding's, and the few ulps a scale of 1-3 % on
#: some rows or columns leaves (within the elementwise allowance of 3 x bf16's norm bound, and diluted in the
#: norm by the rows it spares); an honest kernel's larger errors (cancellation, op-by-op roundings) go either way
MAX_ERROR_ULP = 8.0
#: a region (a block of rows or of columns) holds about this many elements
REGION_ELEMENTS = 1024
#: a region is judged from this many deviations on (an honest kernel computing in float32 deviates from
#: round-to-nearest only near ties: a few in a thousand elements)
REGION_MIN_DEVIATIONS = 64
#: and at least this share of them one way (and six standard deviations of a fair coin above one half: over
#: thousands of regions, four would let honest ones through by chance)
REGION_MIN_SHARE = 0.9
#: a bias the reference's own run at the inputs' precision shows in the same region (at least half of MIN_BIAS_ULP,
#: this direction or the opposite) excuses the candidate's up to this factor of it plus this margin: a kernel rounding the same
#: shared value in float32 math errs up to 1.3 times the op-by-op reference's; a truncating cast, 0.5 ulp, is not
#: excused by a row normaliser's 0.1
EXCUSE_FACTOR = 1.5
EXCUSE_MARGIN_ULP = 0.05
#: a block of rows is excused up to this bias beyond round-to-nearest's where the output's rows lean both ways
#: (:attr:`shared_rounding.Fit.spread`): values shared by a row, rounded, then used in more roundings (an op-by-op
#: bf16 LayerNorm rounds its variance and its ``rsqrt``, each up to half a relative ulp) shift a row by up to
#: 0.78 ulp (measured, 64 rows of 4096); a truncating cast shifts every row the same way, and a row scaled by
#: 1 % shifts it 1.3-2.6 ulps
SHARED_SHIFT_ULP = 1.0
#: and a block of rows or of columns, where the output's lines (rows or columns, as the block) lean both ways, up
#: to this bias where its lean is the same in ulps across each binade rather than growing with the value (see
#: :data:`SCALE_GROWTH`): a value shared by a column (a bias, a gate, a shift) added op by op in bf16 after another
#: rounding shifts the column by that value's place between two bf16 values, and chained such steps reach 1.35 ulp
#: (a DiT-XL block's next LayerNorm and modulation in bf16 on an H100)
OFFSET_SHIFT_ULP = 2.0
#: a lean is a scale's where its mean over the upper half of each binade (values 1.5-2 x a power of two) is at
#: least this factor of its mean over the lower half (a scale of 1 % or more: 1.3-1.4; a shared value's rounding: 1.0)
SCALE_GROWTH = 1.2
#: (name, whether it is measured against the reference's sign, the deviation's sign that counts)
DIRECTIONS = (("toward zero", True, -1), ("away from zero", True, 1), ("toward -inf", False, -1),
              ("toward +inf", False, 1))


@dataclass(frozen=True)
class RoundingBias:
    """One output's directed rounding: where, its direction and the counts behind it."""

    direction: str
    judged: int  # elements with an inexact, non-tie exact value and an error within MAX_ERROR_ULP
    deviations: int  # of those, where the candidate is not the correctly rounded value
    one_way: int  # of the deviations, those in ``direction``
    bias_ulp: float  # the candidate's mean error in ``direction``, in ulps
    nearest_bias_ulp: float  # round-to-nearest's, on the same elements
    region: str = "the whole output"  # or "rows 60-63 of 64", "columns 960-975 of 1000"
    excuse_ulp: float | None = None  # the reference's own excess that way at the inputs' precision, where measured
    rows_note: str | None = None  # why one rounded value per row does not explain it, where that is the rows' signs

    def lines(self, name: str, dtype: torch.dtype) -> list[str]:
        share = self.one_way / self.deviations
        where = "" if self.region == "the whole output" else f" in {self.region}"
        lines = [f"{name} ({str(dtype).removeprefix('torch.')}){where}: {self.deviations} of {self.judged} elements "
                 f"differ from the correctly rounded reference (round to nearest), {self.one_way} of them ({share:.0%}) "
                 f"{self.direction}; mean error {self.bias_ulp:.2f} ulp {self.direction} (round to nearest: "
                 f"{self.nearest_bias_ulp:+.2f})"]
        if self.excuse_ulp is not None:
            lines.append(f"the reference's own run at the inputs' precision errs {self.excuse_ulp:.2f} ulp one way "
                         f"(this or the opposite) beyond round to nearest there: it excuses up to "
                         f"{EXCUSE_FACTOR * self.excuse_ulp + EXCUSE_MARGIN_ULP:.2f} ulp, not "
                         f"{self.bias_ulp - self.nearest_bias_ulp:.2f}")
        if self.rows_note is not None:
            lines.append(self.rows_note)
        lines.append("a kernel rounding to nearest deviates only near ties, either way: this looks like a truncating "
                     "cast (round toward zero), a directed rounding mode, a one-signed approximation or a scale of up "
                     f"to a few percent (errors up to {MAX_ERROR_ULP:g} ulps are judged)"
                     + ("" if self.region == "the whole output" else " in part of the output (a tile's epilogue)")
                     + "; check_rounding=False accepts it")
        return lines


class _Sums:
    """Sums over the judged elements of each region of one partition of an output: one float64 row per
    quantity (see :func:`_stats`), one column per region."""

    def __init__(self, regions: int, device: torch.device) -> None:
        self.table = torch.zeros(_STATS, regions, dtype=torch.float64, device=device)

    def add(self, region: torch.Tensor, stats: torch.Tensor) -> None:
        self.table.index_add_(1, region, stats)

    @property
    def judged(self) -> torch.Tensor:
        return self.table[0]

    @property
    def deviations(self) -> torch.Tensor:
        return self.table[1]

    @property
    def one_way(self) -> torch.Tensor:
        """Deviations in each direction: ``(4, regions)``."""
        return self.table[2:2 + len(DIRECTIONS)]

    def biases(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The output's and round-to-nearest's mean error per direction and region, in ulps: ``(4, regions)``."""
        judged = self.judged.clamp(min=1)
        ways = torch.tensor([float(way) for _, _, way in DIRECTIONS], dtype=torch.float64,
                            device=judged.device)[:, None]
        rows = [(7 if signed else 6) for _, signed, _ in DIRECTIONS]
        return ways * self.table[rows] / judged, ways * self.table[[row + 2 for row in rows]] / judged


#: rows of a :class:`_Sums` table: judged, deviations, one per direction, the errors' sums in ulps plain and
#: against the exact value's sign, round-to-nearest's the same two
_STATS = 2 + len(DIRECTIONS) + 4


def _stats(step: torch.Tensor, sign: torch.Tensor, mine: torch.Tensor, theirs: torch.Tensor) -> torch.Tensor:
    """The :class:`_Sums` rows of each judged element: ``(_STATS, elements)``."""
    rows = [torch.ones_like(mine), (step != 0).to(torch.float64)]
    rows += [((step * sign if signed else step) == way).to(torch.float64) for _, signed, way in DIRECTIONS]
    rows += [mine, mine * sign, theirs, theirs * sign]
    return torch.stack(rows)


@dataclass(frozen=True)
class _Partition:
    """The output's elements split into regions: the whole output, blocks of rows or blocks of columns of its
    last two dims (leading dims counted as rows)."""

    name: str  # "output", "rows", "columns"
    block: int  # rows or columns per region
    total: int  # rows or columns in all
    regions: int

    def region_of(self, flat: torch.Tensor, width: int) -> torch.Tensor:
        if self.name == "output":
            return torch.zeros_like(flat)
        line = flat // width if self.name == "rows" else flat % width
        return line // self.block

    def describe(self, region: int) -> str:
        if self.name == "output":
            return "the whole output"
        first, last = region * self.block, min(self.total, (region + 1) * self.block) - 1
        span = f"{self.name[:-1]} {first}" if first == last else f"{self.name} {first}-{last}"
        return f"{span} of {self.total}"


def _partitions(shape: torch.Size) -> list[_Partition]:
    """The whole output, then its blocks of rows and of columns (none for a single element)."""
    parts = [_Partition("output", 1, 1, 1)]
    numel = math.prod(shape)
    if not shape or numel <= REGION_ELEMENTS:
        return parts
    width = shape[-1]
    rows = numel // width
    for name, lines, other in (("rows", rows, width), ("columns", width, rows)):
        block = max(1, math.ceil(REGION_ELEMENTS / other))
        if block < lines:
            parts.append(_Partition(name, block, lines, math.ceil(lines / block)))
    return parts


def _measure(output: torch.Tensor, reference: torch.Tensor) -> list[tuple[_Partition, _Sums]] | None:
    """The rounding of ``output`` (a 16-bit float output) against ``reference`` (its exact value, in a wider dtype),
    summed per region of each partition; None where it is not judged (another dtype, another shape, a reference
    no wider than the output, no element judged)."""
    dtype = output.dtype
    if dtype not in ROUNDED_DTYPES or output.shape != reference.shape or not reference.is_floating_point() \
            or torch.finfo(reference.dtype).bits <= torch.finfo(dtype).bits or output.numel() == 0:
        return None
    info = torch.finfo(dtype)
    width = output.shape[-1] if output.dim() else 1
    partitions = [(part, _Sums(part.regions, output.device)) for part in _partitions(output.shape)]
    for start, (out, ref) in compare.chunks(output, reference):
        exact = ref.to(torch.float64)
        got = out.to(torch.float64)
        nearest = exact.to(dtype).to(torch.float64)
        size = exact.abs()
        ulp = compare.spacing(size, dtype)
        error, nearest_error = (got - exact) / ulp, (nearest - exact) / ulp
        keep = (torch.isfinite(exact) & torch.isfinite(got) & (size >= info.tiny) & (size <= info.max)
                & (nearest != exact) & ((nearest_error.abs() - 0.5).abs() > 1e-9) & (error.abs() <= MAX_ERROR_ULP))
        if not bool(keep.any()):
            continue
        flat = start + keep.nonzero()[:, 0]
        stats = _stats(torch.sign(got[keep] - nearest[keep]), torch.sign(exact[keep]), error[keep],
                       nearest_error[keep])
        for part, sums in partitions:
            sums.add(part.region_of(flat, width), stats)
    if float(partitions[0][1].judged[0]) == 0:
        return None
    return partitions


def _failing(part: _Partition, sums: _Sums) -> list[tuple[int, int, float, float]]:
    """``(region, direction index, bias, round-to-nearest's bias)`` of each region and direction that fails,
    largest excess first."""
    whole = part.name == "output"
    minimum, floor, sigmas = ((MIN_DEVIATIONS, MIN_SHARE, 2.0) if whole
                              else (REGION_MIN_DEVIATIONS, REGION_MIN_SHARE, 3.0))
    deviations = sums.deviations
    share = torch.maximum(torch.full_like(deviations, floor), 0.5 + sigmas / deviations.clamp(min=1).sqrt())
    bias, nearest = sums.biases()
    fails = ((deviations >= minimum)[None] & (sums.one_way >= share[None] * deviations[None])
             & (bias >= MIN_BIAS_ULP) & (bias - nearest >= MIN_BIAS_ULP))
    found = [(int(region), int(way), float(bias[way, region]), float(nearest[way, region]))
             for way, region in fails.nonzero().tolist()]
    return sorted(found, key=lambda item: item[3] - item[2])


def rounding_bias(candidate: torch.Tensor, reference: torch.Tensor,
                  same_precision: Callable[[], torch.Tensor | None] | None = None) -> RoundingBias | None:
    """The directed rounding of ``candidate`` against ``reference`` (its exact value, in a wider dtype), over the
    whole output and over its blocks of rows and columns, or None: not judged (other dtypes, too few deviations
    from round-to-nearest) or no direction stands out anywhere. ``same_precision()``: the reference's own output
    at the inputs' precision (asked for only where a region fails); a bias it shows too, in the same region, this
    direction or the opposite one, excuses the candidate's up to :data:`EXCUSE_FACTOR` times as much plus
    :data:`EXCUSE_MARGIN_ULP`."""
    measured = _measure(candidate, reference)
    if measured is None:
        return None
    excuses: list[tuple[_Partition, _Sums]] | None = None
    rows: shared_rounding.Fit | None = None
    spreads: _LazySpreads | None = None
    asked = False
    for index, (part, sums) in enumerate(measured):
        for region, way, bias, nearest in _failing(part, sums):
            if not asked and same_precision is not None:
                asked, same = True, same_precision()
                excuses = _measure(same, reference) if same is not None else None
            excuse = None
            if excuses is not None:
                theirs, their_nearest = excuses[index][1].biases()
                excuse = max(float(theirs[w, region] - their_nearest[w, region]) for w in (way, way ^ 1))
                if excuse >= MIN_BIAS_ULP / 2 and bias - nearest <= EXCUSE_FACTOR * excuse + EXCUSE_MARGIN_ULP:
                    continue
            if rows is None:
                rows = shared_rounding.fit(candidate, reference, [p for p, _ in measured], MAX_ERROR_ULP)
                spreads = _LazySpreads(candidate, reference, rows.spread)
            if rows.excuses(index, region):
                continue
            if part.name != "output" and spreads is not None and _shared_shift(
                    bias - nearest, lambda: spreads.get(part.name),
                    lambda: _scale_like(candidate, reference, part, region, DIRECTIONS[way])):
                continue
            return RoundingBias(DIRECTIONS[way][0], int(sums.judged[region]), int(sums.deviations[region]),
                                int(sums.one_way[way, region]), bias, nearest, part.describe(region),
                                excuse if excuse is not None and excuse >= MIN_BIAS_ULP / 2 else None, rows.note)
    return None


def _shared_shift(excess: float, spread: Callable[[], bool], scale_like: Callable[[], bool]) -> bool:
    """Whether a block of rows or columns leaning ``excess`` ulps beyond round-to-nearest's is the rounding of
    values shared by its lines: the output's lines lean both ways, and the lean is at most
    :data:`SHARED_SHIFT_ULP`, or at most :data:`OFFSET_SHIFT_ULP` and not a scale's."""
    return excess <= OFFSET_SHIFT_ULP and spread() and (excess <= SHARED_SHIFT_ULP or not scale_like())


class _LazySpreads:
    """Whether the output's rows (known from the row fit) and its columns (measured when first asked) lean both
    ways (:func:`shared_rounding.spread`)."""

    def __init__(self, output: torch.Tensor, reference: torch.Tensor, rows: bool) -> None:
        self._output, self._reference = output, reference
        self._known = {"rows": rows}

    def get(self, name: str) -> bool:
        if name not in self._known:
            width = self._output.shape[-1]
            columns = (self._output.reshape(-1, width).t(), self._reference.reshape(-1, width).t())
            self._known[name] = shared_rounding.spread(*columns, MAX_ERROR_ULP)
        return self._known[name]


def _scale_like(output: torch.Tensor, reference: torch.Tensor, part: _Partition, region: int,
                direction: tuple[str, bool, int]) -> bool:
    """Whether the region's lean grows with each element's place in its binade, as a scale's does (an error of
    s x |value| is twice as many ulps at the top of a binade as at its bottom); a value shared by the line and
    rounded on the way (a bias added in bf16 after the GEMM's own rounding) shifts every element of a binade by
    the same number of ulps, wherever it sits."""
    width = output.shape[-1]
    first, last = region * part.block, (region + 1) * part.block
    got2d, exact2d = output.reshape(-1, width), reference.reshape(-1, width)
    got, exact = ((got2d[first:last], exact2d[first:last]) if part.name == "rows"
                  else (got2d[:, first:last], exact2d[:, first:last]))
    got, exact = got.to(torch.float64), exact.to(torch.float64).to(got.device)
    _, signed, way = direction
    lean = shared_rounding.beyond_nearest(got, exact, output.dtype) * way * (torch.sign(exact) if signed else 1)
    keep = shared_rounding.judged_elements(got, exact, output.dtype, MAX_ERROR_ULP)
    size = exact.abs()
    place = size / torch.exp2(torch.floor(torch.log2(size.clamp(min=torch.finfo(output.dtype).tiny))))  # in [1, 2)
    low, high = keep & (place < 1.5), keep & (place >= 1.5)
    if int(low.sum()) < MIN_DEVIATIONS or int(high.sum()) < MIN_DEVIATIONS:
        return True  # too few to tell: judged as a scale
    low_mean, high_mean = float(lean[low].mean()), float(lean[high].mean())
    return high_mean >= SCALE_GROWTH * max(low_mean, 1e-9)


def excess_bias(output: torch.Tensor | None, reference: torch.Tensor) -> float:
    """The largest mean error of ``output`` over the whole output in any direction beyond round-to-nearest's, in
    ulps (0.0 where it is not judged): what the reference's own run at the output's precision shows where a
    shared value rounded at that precision (a row's normaliser, a log-sum-exp) shifts whole rows one way."""
    measured = None if output is None else _measure(output, reference)
    if measured is None:
        return 0.0
    bias, nearest = measured[0][1].biases()
    return max(0.0, float((bias - nearest)[:, 0].max()))
