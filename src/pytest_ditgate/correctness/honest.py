"""The honest-error estimate of one output: how far a correct kernel may be from the float64 reference.

Measured on the reference alone, so the candidate cannot inflate it: the reference run at the candidate's
precision (its inputs' dtypes, TF32 off unless declared) and the reference run on ``|inputs|`` (the size
of the terms a sum or dot product adds, which sets the rounding error of any summation order).
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator

import torch

from pytest_ditgate.correctness.report import HonestBound
from pytest_ditgate.correctness import tolerances
from pytest_ditgate.correctness.tolerances import HonestRule


def estimate(reference: torch.Tensor, same: torch.Tensor | None, magnitude: torch.Tensor | None, *,
             table: float, roundoff: float, ceiling: float, rule: HonestRule | None = None,
             notes: tuple[str, ...] = (), inputs_per_output: float | None = None) -> HonestBound:
    """The relative-norm bound for one output: the table's, widened to the honest-error estimate, capped.

    ``same`` is the reference's output at the candidate's precision, ``magnitude`` its output on
    ``|inputs|`` (either None when not run); ``inputs_per_output`` the floating input elements per output
    element (the length of the sums it may take). A degenerate run (non-finite where the reference is finite,
    wrong shape) is not used and says so; a reference that is zero everywhere leaves the table's bound.
    """
    rule = rule if rule is not None else tolerances.HONEST_RULE
    notes = list(notes)
    r = _wide(reference)
    finite = torch.isfinite(r)
    ref_norm = float(torch.where(finite, r, 0).norm())
    same_rel = magnitude_rel = None
    if ref_norm == 0 or not bool(finite.any()):
        if same is not None or magnitude is not None:
            notes.append("reference is zero everywhere: no relative estimate")
    else:
        same_rel = _relative(same, r, finite, ref_norm, "same-precision", notes)
        size = _relative(magnitude, torch.zeros_like(r), finite, ref_norm, "|inputs|", notes, absolute=True)
        magnitude_rel = None if size is None else roundoff * size
    widened = [("table", table)]
    if same_rel is not None:
        widened.append(("same-precision", rule.same_precision * same_rel))
    if magnitude_rel is not None:
        widened.append(("magnitude", rule.magnitude * magnitude_rel))
    length_rel = None
    if inputs_per_output is not None and inputs_per_output > 1:
        length_rel = roundoff * math.sqrt(inputs_per_output)
        widened.append(("length", rule.length * length_rel))
    source, bound = max(widened, key=lambda item: item[1])
    if bound > max(ceiling, table):
        source, bound = "ceiling", max(ceiling, table)
    return HonestBound(table=table, same_precision=same_rel, magnitude=magnitude_rel, length=length_rel, bound=bound,
                       source=source, rule=rule, notes=tuple(notes))


def _relative(other: torch.Tensor | None, r: torch.Tensor, finite: torch.Tensor, ref_norm: float, what: str,
              notes: list[str], *, absolute: bool = False) -> float | None:
    """``||other - r|| / ||reference||`` over the reference's finite entries (``||other||`` when absolute)."""
    if other is None:
        return None
    if tuple(other.shape) != tuple(r.shape):
        notes.append(f"{what} run has shape {list(other.shape)}: not used")
        return None
    o = _wide(other).to(r.device)
    if not bool(torch.isfinite(o)[finite].all()):
        notes.append(f"{what} run is non-finite where the reference is finite: not used")
        return None
    gap = torch.where(finite, o if absolute else o - r, 0)
    return float(gap.norm()) / ref_norm


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
