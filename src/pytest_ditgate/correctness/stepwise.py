"""Op-by-op roundings at half precision: the bound for an output that the reference's own code, run at the
candidate's precision, fails.

The honest-error estimate models a kernel that sums in fp32 and rounds its result once (a fused kernel, a
Triton or CUDA kernel, torch.compile's code). torch's eager ops in bf16 or fp16 round every intermediate result
to that dtype, and where a later op amplifies one of those roundings the output errs far beyond that model: a
cross entropy's log-probability of -10 held in bf16 is off by up to 0.03, so the exponent of it (the gradient
of a column far from the target) errs by up to 3 % of the element; a RoPE's two products near 1e3, each rounded
to bf16 (spacing 4 to 8) and then added to about 60, err by several units. Such a computation is honest by
definition where it is the reference's own code at the candidate's precision, so the gate does not refuse what
that run would fail: where it fails the bound too, the gate measures the conditioning again with every
intermediate result perturbed by one rounding of the half-precision dtype (:mod:`conditioning`'s Monte Carlo
arithmetic at that roundoff) and judges the output by that (``op_by_op`` in :func:`honest.estimate`).

Only then, and only where that run is credible: an output the reference's own half-precision run passes is held
to the accumulator's bound, so a kernel that rounds more than the reference's own arithmetic does is still
refused; and a run that errs beyond what its simulated roundings explain (an intermediate that underflows or
overflows as a whole) is degenerate and opens nothing.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch

from pytest_ditgate.correctness import compare
from pytest_ditgate.correctness.report import OutputComparison
from pytest_ditgate.correctness.tolerances import UNIT_ROUNDOFF
from pytest_ditgate.dtypes import dtype_name

#: the fewest rows with elements excused only op by op that the lean test reads, and how many standard deviations
#: of a fair coin the count of rows leaning up may stray (3.5: all 12 rows one way, or 15 of 16; an honest output
#: whose rows' shared roundings lean at random strays so far about once in 4000 outputs)
LEAN_MIN_ROWS, LEAN_SIGMAS = 8, 3.5

#: the dtypes torch's eager ops compute in at half precision (fp8 has no eager arithmetic: its kernels sum in fp32)
HALF_PRECISION = ("float16", "bfloat16")


def roundoff(dtypes: Iterable[torch.dtype]) -> float | None:
    """The unit roundoff of the coarsest half-precision dtype among ``dtypes`` (None where there is none)."""
    found = [UNIT_ROUNDOFF[name] for name in map(dtype_name, dtypes) if name in HALF_PRECISION]
    return max(found) if found else None


def judge(name: str, cand: torch.Tensor, ref: torch.Tensor, same: torch.Tensor, tolerance: Any, local: Any,
          measured: Any, op_by_op: tuple[float, Any] | None,
          bound_with: Callable[[str | None], Any]) -> tuple[OutputComparison | None, str | None]:
    """``(cand judged op by op at half precision, None)``; ``(None, None)`` where that does not apply: the
    reference's own run at the candidate's precision (``same``) passes the accumulator's bound
    (``bound_with(None)``), or no credible op-by-op conditioning was measured for this output (``op_by_op``:
    ``(roundoff, Conditioning)``); ``(None, why)`` where the elements it would excuse err one way. The norm's
    ceiling is lifted to the same-precision term (``bound_with(dtype)``); each element may err by its own
    simulated rounding error op by op."""
    spread = measured.elementwise.get(name)
    accumulator = bound_with(None)
    own = compare.compare_output(name, same, ref, tolerance, accumulator, local, spread)
    if own.passed or op_by_op is None:
        return None, None
    roundoff, stepwise = op_by_op
    wider, simulated = stepwise.elementwise.get(name), stepwise.relative.get(name)
    if wider is None or simulated is None or not credible(accumulator.same_precision, simulated, accumulator.rule):
        return None, None
    if spread is not None:
        wider = torch.maximum(spread, wider)
    wider = torch.maximum(wider, own_error(same, ref, tolerance_factor(bound_with)))
    dtype = dtype_at(roundoff)
    result = compare.compare_output(name, cand, ref, tolerance, bound_with(dtype), local, wider)
    if not result.passed:
        return result, None
    (up, rows), (above, excused) = lean(cand, ref, accumulator, spread)
    width = ref.shape[-1] if ref.dim() and ref.shape[-1] else 1
    if ref.numel() // width >= LEAN_MIN_ROWS:  # enough rows: rows are the draws (few of them excused: row-local)
        if rows >= LEAN_MIN_ROWS and abs(2 * up - rows) > LEAN_SIGMAS * rows ** 0.5:
            return None, (f"not judged op by op at {dtype}: in {max(up, rows - up)} of the {rows} rows with elements "
                          "that only op-by-op roundings would excuse, those elements err "
                          f"{'above' if up > rows - up else 'below'} the reference, where a row's roundings lean up "
                          "or down at random (a wrong scale or offset leans one way in every row)")
    elif abs(2 * above - excused) > LEAN_SIGMAS * excused ** 0.5:
        return None, (f"not judged op by op at {dtype}: of the {excused} elements that only op-by-op roundings would "
                      f"excuse, {max(above, excused - above)} err {'above' if above > excused - above else 'below'} "
                      f"the reference, and the output's {ref.numel() // width} row(s) are too few to tell a row's shared "
                      f"rounding from a wrong scale or offset (at least {LEAN_MIN_ROWS} are needed)")
    return result, None


def lean(cand: torch.Tensor, ref: torch.Tensor, accumulator: Any,
         spread: torch.Tensor | None) -> tuple[tuple[int, int], tuple[int, int]]:
    """``((up, rows), (above, excused))``: the rows (the last dimension's lines) holding elements whose error
    exceeds the accumulator's allowance (approximately: its norm-bound term, its conditioning term and the
    dtype's spacing) and how many of them have more such elements above the reference than below; and those
    elements, and how many of them lie above. A row's shared roundings (a log-sum-exp or a mean held at half
    precision) move its elements one way together, so rows, not elements, are the independent draws where
    there are enough of them."""
    rule, bound = accumulator.rule, accumulator.bound
    width = ref.shape[-1] if ref.dim() and ref.shape[-1] else 1
    rows = [t.detach().reshape(-1, width) for t in (cand, ref) + ((spread,) if spread is not None else ())]
    step = max(1, compare.CHUNK // width)  # rows at a time: a few float64 copies of one chunk, not of the output
    mean = sum(float(r.double().abs().nan_to_num_(nan=0.0, posinf=0.0).sum()) for r in rows[1].split(step)) / \
        max(1, ref.numel())
    up = counted = above = excused = 0
    for start in range(0, rows[0].shape[0], step):
        c, r = (t[start:start + step].double() for t in rows[:2])
        diff = (c - r).nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
        size = r.abs().nan_to_num_(nan=0.0, posinf=0.0)
        allowed = torch.maximum((size + mean).mul_(rule.elementwise * bound), compare.spacing(size, cand.dtype))
        if spread is not None:
            allowed = torch.maximum(allowed, rows[2][start:start + step].double() * rule.conditioning)
        beyond = diff.abs() > allowed
        high, low = (diff > 0) & beyond, (diff < 0) & beyond
        leaning = beyond.any(dim=1)
        up += int(((high.sum(dim=1) - low.sum(dim=1)) > 0)[leaning].sum())
        counted += int(leaning.sum())
        above += int(high.sum())
        excused += int(beyond.sum())
    return (up, counted), (above, excused)


def credible(same_rel: float | None, simulated: float, rule: Any) -> bool:
    """The reference's own half-precision run errs no more than its simulated roundings explain (the
    conditioning factor over their rel-norm error): a run whose intermediate underflows or overflows as a whole
    (``(x * 1e-8) * 1e8`` in fp16 is zero) is degenerate, not a measure of honest error, and opens nothing."""
    return same_rel is not None and same_rel <= rule.conditioning * simulated


def own_error(same: torch.Tensor, ref: torch.Tensor, factor: float) -> torch.Tensor:
    """The reference's own half-precision run's error at the elements it flushed to zero or to a subnormal,
    scaled to the units of a simulated rounding error (the allowance multiplies those by the conditioning
    factor); zero elsewhere. Monte Carlo noise multiplies values and never draws an underflow, which the run
    shows: a softmax of logits x 1e3 whose saved probabilities are below fp16's range has a gradient of zero
    there in any kernel that keeps them in fp16."""
    tiny = torch.finfo(same.dtype).tiny
    out = torch.zeros(ref.numel(), dtype=torch.float32, device=ref.device)
    for start, (s, r) in compare.chunks(same, ref, device=ref.device):  # a chunk at a time: LLM-sized outputs
        error = (s.double() - r.double()).abs_().nan_to_num_(nan=0.0, posinf=0.0).mul_(factor)
        out[start:start + s.numel()] = error.masked_fill_(s.abs() >= tiny, 0.0).float()
    return out.reshape(ref.shape)


def tolerance_factor(bound_with: Callable[[str | None], Any]) -> float:
    """The same-precision factor over the conditioning factor (the spread between two orders at one precision,
    in the units the element's allowance multiplies)."""
    rule = bound_with(None).rule
    return rule.same_precision / rule.conditioning


def dtype_at(unit_roundoff: float) -> str:
    """The half-precision dtype whose unit roundoff this is."""
    return next(name for name in HALF_PRECISION if UNIT_ROUNDOFF[name] == unit_roundoff)
