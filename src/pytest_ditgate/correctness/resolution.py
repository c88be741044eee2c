"""Which rounding grid the precision probe moves each input within: the cell sizes per dtype. Torch-free.

A kernel that reads an input at a lower precision rounds it to that precision's grid: every value inside one
cell of the grid reads the same. The probe (:mod:`pytest_ditgate.correctness.precision_probe`) moves each
floating input inside its cell of the grid *next coarser* than what the kernel claims, so a kernel that reads
at that grid or any coarser one returns exactly the same output, while a kernel that reads the inputs as
they are sees them change. The ladder of grids, by explicit mantissa bits
(:data:`pytest_ditgate.dtypes.MANTISSA_BITS`): float64 (52), float32 (23), tf32 and float16 (10), bfloat16
(7), float8 e4m3 (3). Every coarser grid's rounding boundaries lie on the finer grid's points, never inside
the half of a finer cell an input stays in, so one move is invisible to the whole ladder below it:

- float32 inputs get 10-bit cells, which tf32, fp16, bf16 and fp8 cannot see (about 1850 float32 ulps);
- float16 inputs get bfloat16's 7-bit cells; bfloat16 inputs get fp8's 3-bit cells;
- float64 inputs get float32's 23-bit cells (a float64 kernel that computes in float32).

``compute_dtype`` declares the claim: a kernel declared ``tf32`` (or ``float16``) is probed at bf16's
cells, one declared ``bfloat16`` at fp8's, and one declared fp8 (or with fp8 inputs) not at all: nothing
coarser is left to tell apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from pytest_ditgate.dtypes import MANTISSA_BITS, dtype_name

#: the grids the probe moves inputs within, finest first: mantissa bits and the precisions that read at them
LADDER: tuple[tuple[int, str], ...] = ((52, "float64"), (23, "float32"), (10, "tf32/float16"), (7, "bfloat16"),
                                       (3, "float8"))


def grid_name(bits: int) -> str:
    """``10`` -> ``"tf32/float16"``: the precisions that read at a grid of that many mantissa bits."""
    return dict(LADDER).get(bits, f"{bits}-bit")


def unseen_by(bits: int) -> tuple[str, ...]:
    """The precisions of the ladder that cannot see a move inside a cell of ``bits`` mantissa bits (the grid
    itself and every coarser one)."""
    return tuple(name for grid, name in LADDER if grid <= bits)


def claimed_bits(input_dtype: Any, compute_dtype: Any = None) -> int | None:
    """The resolution a kernel claims for an input of ``input_dtype``: the input's own, or the declared
    ``compute_dtype``'s where that is coarser (None: not a floating dtype)."""
    bits = MANTISSA_BITS.get(dtype_name(input_dtype))
    if bits is None:
        return None
    declared = MANTISSA_BITS.get(dtype_name(compute_dtype)) if compute_dtype is not None else None
    return min(bits, declared) if declared is not None else bits


def cell_bits(input_dtype: Any, compute_dtype: Any = None) -> int | None:
    """The grid an input of ``input_dtype`` is moved within: the next coarser than the claim (None: no
    floating input, or nothing coarser than the claim)."""
    claim = claimed_bits(input_dtype, compute_dtype)
    if claim is None:
        return None
    coarser = [grid for grid, _ in LADDER if grid < claim]
    return coarser[0] if coarser else None


@dataclass(frozen=True)
class Cells:
    """How one input is moved: its name, dtype, the grid's mantissa bits (None: it stays) and why."""

    name: str
    dtype: str
    bits: int | None
    why: str

    def __str__(self) -> str:
        return f"{self.name} {self.dtype}: {self.why}"


def plan(inputs: Iterable[tuple[str, Any]], compute_dtype: Any = None,
         fixed: Iterable[str] = ()) -> list[Cells]:
    """One :class:`Cells` per named input ``(name, dtype)``; the arguments named in ``fixed`` (output buffers,
    workspaces) stay as they are."""
    fixed = set(fixed)
    declared = dtype_name(compute_dtype) if compute_dtype is not None else None
    cells = []
    for name, dtype in inputs:
        dname = dtype_name(dtype)
        if name.split("[")[0] in fixed:
            cells.append(Cells(name, dname, None, "not moved (an output buffer or workspace)"))
            continue
        if dname not in MANTISSA_BITS:
            cells.append(Cells(name, dname, None, "not moved (not floating)"))
            continue
        bits = cell_bits(dname, compute_dtype)
        by_declaration = declared is not None and claimed_bits(dname, declared) != MANTISSA_BITS[dname]
        if bits is None:
            claim = f"compute_dtype={declared!r}" if by_declaration else dname
            cells.append(Cells(name, dname, None, f"not moved ({claim} has no coarser precision to tell apart)"))
            continue
        claim = f" (compute_dtype={declared!r})" if by_declaration else ""
        cells.append(Cells(name, dname, bits, f"moved within {grid_name(bits)}'s {bits}-bit cells{claim}, which "
                                              f"{', '.join(unseen_by(bits))} cannot see"))
    return cells
