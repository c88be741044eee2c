"""Directed rounding in 16-bit outputs: a kernel that rounds one way (a truncating cast, round toward -inf, a
one-signed approximation) stays within one ulp, so any tolerance passes it, yet it shifts every output the same
way, and such shifts add up through a network's layers where round-to-nearest errors cancel.

The test compares the candidate with the correctly rounded reference (round to nearest, even on ties), element
by element, where the exact value is not representable, is no tie, and the candidate's error is within one
rounding (larger errors are the computation's, judged by the tolerance). A kernel that rounds to nearest from a
more precise result deviates from that only near ties, either way; double rounding (an intermediate in bf16) and
stochastic rounding deviate either way too. A directed one deviates one way, and its mean error in that way
exceeds round-to-nearest's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from pytest_ditgate.correctness import compare

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
#: (name, whether it is measured against the reference's sign, the deviation's sign that counts)
DIRECTIONS = (("toward zero", True, -1), ("away from zero", True, 1), ("toward -inf", False, -1),
              ("toward +inf", False, 1))


@dataclass(frozen=True)
class RoundingBias:
    """One output's directed rounding: its direction and the counts behind it."""

    direction: str
    judged: int  # elements with an inexact, non-tie exact value and an error within one rounding
    deviations: int  # of those, where the candidate is not the correctly rounded value
    one_way: int  # of the deviations, those in ``direction``
    bias_ulp: float  # the candidate's mean error in ``direction``, in ulps
    nearest_bias_ulp: float  # round-to-nearest's, on the same elements

    def lines(self, name: str, dtype: torch.dtype) -> list[str]:
        share = self.one_way / self.deviations
        return [f"{name} ({str(dtype).removeprefix('torch.')}): {self.deviations} of {self.judged} elements differ "
                f"from the correctly rounded reference (round to nearest), {self.one_way} of them ({share:.0%}) "
                f"{self.direction}; mean error {self.bias_ulp:.2f} ulp {self.direction} (round to nearest: "
                f"{self.nearest_bias_ulp:+.2f})",
                "a kernel rounding to nearest deviates only near ties, either way: this looks like a truncating "
                "cast (round toward zero), a directed rounding mode or a one-signed approximation; "
                "check_rounding=False accepts it"]


@dataclass
class _Tally:
    """Counts and sums over the judged elements of one output."""

    judged: int = 0
    deviations: int = 0
    one_way: dict[str, int] = field(default_factory=lambda: {name: 0 for name, _, _ in DIRECTIONS})
    # the errors' sums in ulps, plain (False) and against the exact value's sign (True): the output's, and
    # round-to-nearest's on the same elements
    error_sum: dict[bool, float] = field(default_factory=lambda: {False: 0.0, True: 0.0})
    nearest_sum: dict[bool, float] = field(default_factory=lambda: {False: 0.0, True: 0.0})

    def biases(self, signed: bool, way: int) -> tuple[float, float]:
        """The output's and round-to-nearest's mean error in a direction, in ulps."""
        return way * self.error_sum[signed] / self.judged, way * self.nearest_sum[signed] / self.judged


def _tally(output: torch.Tensor, reference: torch.Tensor) -> _Tally | None:
    """The rounding of ``output`` (a 16-bit float output) against ``reference`` (its exact value, in a wider dtype),
    or None where it is not judged (another dtype, another shape, a reference no wider than the output)."""
    dtype = output.dtype
    if dtype not in ROUNDED_DTYPES or output.shape != reference.shape or not reference.is_floating_point() \
            or torch.finfo(reference.dtype).bits <= torch.finfo(dtype).bits:
        return None
    info = torch.finfo(dtype)
    tally = _Tally()
    for _, (out, ref) in compare.chunks(output, reference):
        exact = ref.to(torch.float64)
        got = out.to(torch.float64)
        nearest = exact.to(dtype).to(torch.float64)
        size = exact.abs()
        ulp = compare.spacing(size, dtype)
        error, nearest_error = (got - exact) / ulp, (nearest - exact) / ulp
        keep = (torch.isfinite(exact) & torch.isfinite(got) & (size >= info.tiny) & (size <= info.max)
                & (nearest != exact) & ((nearest_error.abs() - 0.5).abs() > 1e-9) & (error.abs() <= 1.0))
        if not bool(keep.any()):
            continue
        sign = torch.sign(exact[keep])
        step = torch.sign(got[keep] - nearest[keep])
        mine, theirs = error[keep], nearest_error[keep]
        tally.judged += int(keep.sum())
        tally.deviations += int((step != 0).sum())
        for name, signed, way in DIRECTIONS:
            tally.one_way[name] += int(((step * sign if signed else step) == way).sum())
        for signed, weight in ((False, 1.0), (True, sign)):
            tally.error_sum[signed] += float((mine * weight).sum())
            tally.nearest_sum[signed] += float((theirs * weight).sum())
    return tally if tally.judged else None


def rounding_bias(candidate: torch.Tensor, reference: torch.Tensor) -> RoundingBias | None:
    """The directed rounding of ``candidate`` against ``reference`` (its exact value, in a wider dtype), or None:
    not judged (other dtypes, too few deviations from round-to-nearest) or no direction stands out."""
    tally = _tally(candidate, reference)
    if tally is None or tally.deviations < MIN_DEVIATIONS:
        return None
    share_needed = max(MIN_SHARE, 0.5 + 2.0 / math.sqrt(tally.deviations))
    for name, signed, way in DIRECTIONS:
        bias, nearest_bias = tally.biases(signed, way)
        if tally.one_way[name] >= share_needed * tally.deviations and bias >= MIN_BIAS_ULP \
                and bias - nearest_bias >= MIN_BIAS_ULP:
            return RoundingBias(name, tally.judged, tally.deviations, tally.one_way[name], bias, nearest_bias)
    return None


def excess_bias(output: torch.Tensor | None, reference: torch.Tensor) -> float:
    """The largest mean error of ``output`` in any direction beyond round-to-nearest's, in ulps (0.0 where it is
    not judged). Applied to the reference's own run at the output's precision: a shared value rounded at that
    precision (a row's normaliser, a log-sum-exp) shifts a whole row one way, and where the reference's own
    run shows such shifts, a direction in the candidate's deviations is the precision's, not the kernel's."""
    tally = None if output is None else _tally(output, reference)
    if tally is None:
        return 0.0
    return max(max(0.0, bias - nearest) for bias, nearest in
               (tally.biases(signed, way) for _, signed, way in DIRECTIONS))
