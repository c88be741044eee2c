"""The honest-error estimate of one output: how far a correct kernel may be from the float64 reference.

Measured on the reference alone, so the candidate cannot inflate it: the reference run at the candidate's
precision (its inputs' dtypes, TF32 off unless declared), the reference run on ``|inputs|`` (the size
of the terms a sum or dot product adds, which sets the rounding error of any summation order), the
reference rounded to the output's dtype, and, where the output still fails, its conditioning
(:mod:`pytest_ditgate.correctness.conditioning`).
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator

import torch

from pytest_ditgate.correctness import compare, tolerances
from pytest_ditgate.correctness.report import HonestBound
from pytest_ditgate.correctness.tolerances import HonestRule


def estimate(reference: torch.Tensor, same: torch.Tensor | None, magnitude: torch.Tensor | None, *,
             table: float, roundoff: float, ceiling: float, rule: HonestRule | None = None,
             notes: tuple[str, ...] = (), inputs_per_output: float | None = None,
             conditioning: float | None = None, output_dtype: torch.dtype | None = None,
             op_by_op: str | None = None) -> HonestBound:
    """The relative-norm bound for one output: the table's, widened to the honest-error estimate, capped.

    ``same`` is the reference's output at the candidate's precision, ``magnitude`` its output on
    ``|inputs|`` (either None when not run); ``inputs_per_output`` the floating input elements per output
    element (the length of the sums it may take); ``conditioning`` the rel-norm error of the reference with
    its intermediate results perturbed by roundings (None when not measured); ``output_dtype`` the dtype the
    candidate returns (the reference rounded to it is the best any kernel can do). A degenerate run
    (non-finite where the reference is finite, wrong shape) is not used and says so; a reference that is zero
    everywhere leaves the table's bound. The ceiling caps the estimate; the conditioning and the output's
    representability lift it, since no kernel at that precision does better. ``op_by_op`` (a half-precision
    dtype's name) says the reference's own run at that precision fails the bound (:mod:`stepwise`): then its
    term lifts the ceiling too, since the reference's own arithmetic at the candidate's precision is honest.
    """
    rule = rule if rule is not None else tolerances.HONEST_RULE
    notes = list(notes)
    ref_norm = compare.norm(reference)
    same_rel = magnitude_rel = representable = None
    if ref_norm == 0:
        if same is not None or magnitude is not None:
            notes.append("reference is zero everywhere: no relative estimate")
        conditioning = op_by_op = None
    else:
        same_rel = _relative(same, reference, ref_norm, "same-precision", notes)
        size = _relative(magnitude, reference, ref_norm, "|inputs|", notes, absolute=True)
        magnitude_rel = None if size is None else roundoff * size
        if output_dtype is not None and output_dtype.is_floating_point and output_dtype != torch.float64:
            representable = _relative(reference, reference, ref_norm, "rounded", notes, cast=output_dtype)
    widened = [("table", table)]
    for source, value, factor in (("same-precision", same_rel, rule.same_precision),
                                  ("magnitude", magnitude_rel, rule.magnitude),
                                  ("conditioning", conditioning, rule.conditioning),
                                  ("representable", representable, rule.representable)):
        if value is not None:
            widened.append((source, factor * value))
    length_rel = None
    if inputs_per_output is not None and inputs_per_output > 1:
        length_rel = roundoff * math.sqrt(inputs_per_output)
        widened.append(("length", rule.length * length_rel))
    cap = max(ceiling, table, *(rule.conditioning * v for v in (conditioning,) if v is not None),
              *(rule.same_precision * v for v in (same_rel,) if v is not None and op_by_op is not None),
              *(rule.representable * v for v in (representable,) if v is not None))
    source, bound = max(widened, key=lambda item: item[1])
    if bound > cap:
        source, bound = "ceiling", cap
    return HonestBound(table=table, same_precision=same_rel, magnitude=magnitude_rel, length=length_rel, bound=bound,
                       source=source, rule=rule, notes=tuple(notes), conditioning=conditioning,
                       representable=representable, ceiling=max(ceiling, table), cap=cap, op_by_op=op_by_op)


def _relative(other: torch.Tensor | None, reference: torch.Tensor, ref_norm: float, what: str, notes: list[str], *,
              absolute: bool = False, cast: torch.dtype | None = None) -> float | None:
    """``||other - r|| / ||reference||`` (``||other||`` when absolute; ``other`` rounded to ``cast`` first), or
    None with a note saying why it is not used."""
    if other is None:
        return None
    if tuple(other.shape) != tuple(reference.shape):
        notes.append(f"{what} run has shape {list(other.shape)}: not used")
        return None
    gap = compare.gap_norm(other, reference, absolute=absolute, cast=cast)
    if gap is None:
        if cast is None:  # a reference beyond the output dtype's range is the trial's to skip, not a note
            notes.append(f"{what} run is non-finite where the reference is finite: not used")
        return None
    return gap / ref_norm


def _wide(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to(torch.complex128 if tensor.is_complex() else torch.float64)


@contextlib.contextmanager
def candidate_precision(tf32: bool, reduced_precision_reduction: bool) -> Iterator[None]:
    """CUDA math flags for the same-precision run: TF32 only when declared, fp16/bf16 GEMM reductions in
    fp32 unless a low-precision accumulator is declared; restored afterwards (the candidate may have set
    them to inflate the estimate). Uses torch's newer ``fp32_precision`` settings where those are in use."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    reductions = (matmul.allow_fp16_reduced_precision_reduction, matmul.allow_bf16_reduced_precision_reduction)
    try:
        legacy = (matmul.allow_tf32, cudnn.allow_tf32)
    except RuntimeError:  # the new API set some flags: reading the legacy ones raises
        legacy = None
    saved = legacy if legacy is not None else (matmul.fp32_precision, cudnn.conv.fp32_precision)
    try:
        if legacy is not None:
            matmul.allow_tf32 = cudnn.allow_tf32 = tf32
        else:
            matmul.fp32_precision = cudnn.conv.fp32_precision = "tf32" if tf32 else "ieee"
        matmul.allow_fp16_reduced_precision_reduction = reduced_precision_reduction
        matmul.allow_bf16_reduced_precision_reduction = reduced_precision_reduction
        yield
    finally:
        if legacy is not None:
            matmul.allow_tf32, cudnn.allow_tf32 = saved
        else:
            matmul.fp32_precision, cudnn.conv.fp32_precision = saved
        matmul.allow_fp16_reduced_precision_reduction, matmul.allow_bf16_reduced_precision_reduction = reductions
