"""The precision probe's decision for one output: does it respond to input moves a lower precision cannot see?

The probe runs the candidate and the float64 reference once more on inputs moved within their cells of a
coarser grid (:mod:`pytest_ditgate.correctness.perturb`). A kernel that reads its inputs at that grid returns
exactly the output it returned before; an honest kernel's output moves with the reference's. Per element:

- ``dr``: how far the float64 reference moved; ``q``: the spacing of the output's dtype there;
- the element is one where an honest kernel's output **would change** when ``|dr| >= 4 q``. An honest
  output is ``round(ref + e)`` with a rounding noise ``e``; it stays the same only if the two noises cancel
  the move to within one cell of the output, ``|dr + e' - e| <= q``. For a symmetric unimodal noise
  difference of any width that has probability at most ``q / (|dr| - q)`` (at most 1/3 at ``4 q``). Where
  the reference moves by more than twice the candidate's own largest error plus ``q`` (sized from its
  errors over the trials, :attr:`OutputComparison.scaled_error`, times a safety factor of 2), the output
  cannot stay, and the probability is taken as 1e-6;
- the output **fails** (``precision_downgrade``) when it stays exactly the same on at least half of those
  elements and a Chernoff bound, ``exp(-n D(1/2 || p))`` with ``p`` the mean of those probabilities over the
  ``n`` elements, puts an honest kernel's chance of doing so at or below :data:`FALSE_ALARM` (1e-4);
- where an output is found unmoved, it is judged again with each element's own rounding noise as the unit of
  a move where that is coarser than ``q``: an honest kernel's (its simulated fp32 rounding, where the output
  cancels) and the float64 reference's own (:mod:`~pytest_ditgate.correctness.reference_noise`, times
  :data:`REFERENCE_NOISE_FACTOR`): an output that is zero by cancellation or by structure (LayerNorm's input
  gradient at a normalised dimension of 1) "moves" by the reference's rounding, which no kernel must follow;
- it **responds** when it changes on more than half of them; it is **inconclusive** when there is no
  such element or too few to reach 1e-4 (a scalar loss: one element), and **out of scope** when it is not
  floating (an index, a count, a mask) or the reference did not move at all (piecewise constant: a floor, a
  sign, a one-hot).

The gain (least-squares slope of the candidate's move on the reference's) and their correlation are reported
but do not decide: an honest sequential sum of positive terms, which rounds away part of each move, has a
gain below 1 and still changes.

Importing this module is torch-free; the judging imports torch. The verdict is a
:class:`~pytest_ditgate.correctness.report.OutputSensitivity`.
"""

from __future__ import annotations

import math
from typing import Any

from pytest_ditgate.correctness.report import OutputSensitivity

#: an honest kernel's chance of failing the probe on one output, at most
FALSE_ALARM = 1e-4
#: an element counts where the reference moves by at least this many spacings of the output's dtype (or of its
#: own rounding noise, where that is coarser)
MIN_MOVE = 4.0
#: where the reference moves by more than twice this many times the candidate's largest error (plus one
#: spacing), an honest output cannot stay the same
ERROR_SAFETY = 2.0
#: the probability taken for such an element
SURE = 1e-6
#: where the reference runs at the output's own precision (no float64 above it), its own rounding noise is
#: about one spacing: elements count only where it moves by this many times more
SAME_PRECISION_FACTOR = 1024.0
#: where the reference's own rounding noise is measured (:mod:`~pytest_ditgate.correctness.reference_noise`),
#: an element counts only where the reference moves by :data:`MIN_MOVE` times this many times that noise: a
#: move within it is the float64 reference's rounding (of an output that is zero by cancellation or by
#: structure), not the function's. A real downgrade's moves are 2^-13 of an element's size (fp32 inputs within
#: 10-bit cells), about 2^30 times a float64 rounding of its terms: the margin costs no element that cancels by
#: less than a factor of about 10^6
REFERENCE_NOISE_FACTOR = 64.0


def chernoff(n: int, p: float, fraction: float = 0.5) -> float:
    """Upper bound on the chance that at least ``fraction`` of ``n`` independent events of mean probability
    ``p`` happen: ``exp(-n D(fraction || p))`` (1 when ``p >= fraction`` or ``n == 0``)."""
    if n <= 0 or p >= fraction:
        return 1.0
    p = max(p, 1e-300)
    divergence = fraction * math.log(fraction / p) + (1 - fraction) * math.log((1 - fraction) / (1 - p))
    return math.exp(-n * divergence)


def judge(name: str, before: Any, after: Any, ref_before: Any, ref_after: Any, *, scaled_error: float,
          reference_precise: bool = True, floor: Any = None, own_noise: Any = None) -> OutputSensitivity:
    """The verdict on output ``name``: the candidate's output ``before`` and ``after`` the move, the
    reference's (float64) ``ref_before`` and ``ref_after``; ``scaled_error`` is the candidate's largest error
    over the trials at each element's scale (``|out - ref| / (|ref| + mean|ref|)``); ``reference_precise``:
    the reference ran in a higher precision than the output's. ``floor`` (the output's shape, or None): each
    element's own rounding noise (its simulated rounding error, where the output cancels): a reference move is
    counted in units of that where it exceeds the dtype's spacing, since an honest kernel's output is no finer
    than its own rounding of the terms it cancels. ``own_noise`` (the output's shape, or None): each element's
    rounding noise in the reference itself; a move counts only where it exceeds
    :data:`REFERENCE_NOISE_FACTOR` times that too, since a move within it is the reference's rounding."""
    import torch

    from pytest_ditgate.correctness import compare

    if not (before.is_floating_point() or before.is_complex()):
        return OutputSensitivity(name, "out_of_scope", before.numel(), reason=(
            f"an output of {str(before.dtype).removeprefix('torch.')} (an index, a count or a mask) is exact: no "
            "rounding for a lower precision to show in"))
    if before.numel() == 0:
        return OutputSensitivity(name, "out_of_scope", 0, reason="an empty output")
    shapes = {tuple(t.shape) for t in (before, after, ref_before, ref_after)}
    if len(shapes) != 1:
        return OutputSensitivity(name, "inconclusive", before.numel(),
                                 reason=f"the outputs on the moved inputs are shaped otherwise ({sorted(shapes)})")
    parts = [torch.view_as_real(t) if t.is_complex() else t for t in (before, after, ref_before, ref_after)]
    real_dtype = parts[0].dtype
    factor = 1.0 if reference_precise else SAME_PRECISION_FACTOR
    mean = _mean_abs(parts[2])
    counts = dict(n=0, unchanged=0, moved=0)
    sums = dict(p=0.0, cr=0.0, rr=0.0, cc=0.0, c=0.0, r=0.0)
    largest = 0.0
    # a complex output's parts are judged without one (its noise is the element's, not each part's)
    floors = [] if floor is None or before.is_complex() or floor.numel() != before.numel() else \
        [floor.reshape(parts[2].shape)]
    own = [] if own_noise is None or before.is_complex() or own_noise.numel() != before.numel() else \
        [own_noise.reshape(parts[2].shape)]
    for _, chunk in compare.chunks(*parts, *floors, *own, device=parts[2].device):
        c0, c1, r0, r1 = chunk[:4]
        r0, r1 = r0.double(), r1.double()
        dr = r1 - r0
        finite = torch.isfinite(dr)  # both finite (the candidate's output is finite where they are)
        if not bool(finite.all()):
            dr.masked_fill_(~finite, 0.0)
        size = torch.maximum(r0.abs(), r1.abs()).masked_fill_(~finite, 0.0)
        size = torch.maximum(size, c0.abs().double().nan_to_num_(nan=0.0, posinf=0.0))
        unit = compare.spacing(size, real_dtype).mul_(factor)
        if floors:
            torch.maximum(unit, chunk[4].double().nan_to_num(nan=0.0, posinf=0.0), out=unit)
        if own:  # an infinite noise (the reference unstable there) keeps the element from counting
            torch.maximum(unit, chunk[-1].double().nan_to_num(nan=float("inf")).mul_(REFERENCE_NOISE_FACTOR),
                          out=unit)
        moves = dr.abs().div_(unit)
        largest = max(largest, float(moves.max()))
        counts["moved"] += int(torch.count_nonzero(dr))
        counted = moves >= MIN_MOVE
        n_here = int(counted.sum())
        if not n_here:
            continue
        if n_here < counted.numel():  # only the counted elements from here on
            moves, dr, r0 = moves[counted], dr[counted], r0[counted]
            c0, c1 = c0[counted], c1[counted]
        stay = (moves - 1.0).reciprocal_().clamp_(max=1.0)
        # where the reference moves past twice the candidate's largest error (and a spacing), it cannot stay
        noise = r0.abs().add_(mean).mul_(2 * ERROR_SAFETY * scaled_error)
        stay.masked_fill_(dr.abs().sub_(dr.abs().div_(moves)) > noise, SURE)
        dc = c1.double() - c0.double()
        counts["n"] += n_here
        counts["unchanged"] += int((c0 == c1).sum())
        sums["p"] += float(stay.sum())
        sums["cr"] += float(dc.dot(dr))
        sums["rr"] += float(dr.dot(dr))
        sums["cc"] += float(dc.dot(dc))
        sums["c"] += float(dc.sum())
        sums["r"] += float(dr.sum())
    n, unchanged = counts["n"], counts["unchanged"]
    figures = dict(numel=before.numel(), would_change=n, unchanged=unchanged, reference_moved=counts["moved"],
                   largest_move=largest)
    if counts["moved"] == 0:
        return OutputSensitivity(name, "out_of_scope", **figures, reason=(
            "piecewise constant: the reference's output did not move at all when the inputs moved within "
            "their cells"))
    if n == 0:
        return OutputSensitivity(name, "inconclusive", **figures, reason=(
            f"the reference moved by less than {MIN_MOVE:g} spacings of {str(before.dtype).removeprefix('torch.')}"
            + (" (or of the element's own rounding noise)" if floors else "")
            + (f" (or {REFERENCE_NOISE_FACTOR:g} x the reference's own rounding noise there: a move within it is "
               "the reference's rounding of an output that is zero by cancellation or by structure)" if own else "")
            + f" on every element (at most {largest:.2g}"
            + ("" if reference_precise else f", counted in units of {SAME_PRECISION_FACTOR:g} spacings: the "
               "reference runs at the output's own precision") + "): an honest kernel's output need not change"))
    mean_p = sums["p"] / n
    bound = chernoff(n, mean_p)
    gain = sums["cr"] / sums["rr"] if sums["rr"] else None
    correlation = _correlation(n, sums)
    figures.update(honest_stay=mean_p, false_alarm=bound, gain=gain, correlation=correlation)
    if 2 * unchanged < n:
        return OutputSensitivity(name, "responds", **figures)
    if bound <= FALSE_ALARM:
        return OutputSensitivity(name, "precision_downgrade", **figures)
    return OutputSensitivity(name, "inconclusive", **figures, reason=(
        f"unchanged on {unchanged} of {n} elements, but an honest kernel does that with a chance of up to "
        f"{bound:.2g} with so few elements (the probe decides at {FALSE_ALARM:g})"))


def _mean_abs(tensor: Any) -> float:
    from pytest_ditgate.correctness import compare

    total = 0.0
    for _, (chunk,) in compare.chunks(tensor):
        total += float(chunk.double().abs().nan_to_num_(nan=0.0, posinf=0.0).sum())
    return total / tensor.numel()


def _correlation(n: int, sums: dict[str, float]) -> float | None:
    """Pearson's correlation of the candidate's moves with the reference's (None when either is constant)."""
    if n < 2:
        return None
    cov = sums["cr"] - sums["c"] * sums["r"] / n
    var_c = sums["cc"] - sums["c"] ** 2 / n
    var_r = sums["rr"] - sums["r"] ** 2 / n
    if var_c <= 0 or var_r <= 0:
        return None
    return cov / math.sqrt(var_c * var_r)
