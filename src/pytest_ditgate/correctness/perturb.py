"""Moving an input within its cells of a coarser rounding grid: the precision probe's inputs.

Each element ``x`` of a floating input is moved 90 % of the way from where it is to the edge of its cell on
the grid of ``bits`` mantissa bits (:mod:`pytest_ditgate.correctness.resolution` picks the grid), towards the
edge on its own side of the cell's centre. The moved value rounds to that grid exactly as ``x`` does, and so
to every coarser grid (their rounding boundaries lie on the grid's points, and the move never crosses one):
a kernel that reads the input at that precision cannot tell the two apart. A float32 input moves by about
1850 of its ulps on average (10-bit cells), a bfloat16 input by about 1.7 % (fp8's 3-bit cells).

The move is integer arithmetic on the bit patterns (within a half cell, on one side of a power of two, the
patterns are evenly spaced values), on the tensor's own device, and exact: the moved value is a value of
the input's dtype. Elements on the grid already (zero among them), infinities and NaNs stay; so does an
element whose cell's centre rounds to infinity. The result keeps the input's layout (strides, storage
offset), as the candidate would see it.
"""

from __future__ import annotations

from typing import Any

from pytest_ditgate.dtypes import MANTISSA_BITS, dtype_name

#: how far towards its cell's edge an element moves (tenths): far, yet clear of the edge's rounding tie
TOWARDS_EDGE_TENTHS = 9


def within_cells(tensor: Any, bits: int) -> Any:
    """A copy of the floating ``tensor`` (real or complex) with every element moved within its cell of the
    ``bits``-bit grid; same dtype, shape, layout and device."""
    import torch

    from pytest_ditgate.correctness.roles import copy_like

    source = tensor.detach().contiguous()
    real = torch.view_as_real(source) if source.is_complex() else source
    moved = _moved(real, bits)
    values = torch.view_as_complex(moved) if source.is_complex() else moved
    return copy_like(tensor, values)


def _moved(real: Any, bits: int) -> Any:
    """``real`` (contiguous, real floating) with its elements moved; a new tensor. The arithmetic runs on the
    magnitudes' bit patterns in the dtype's own integer width (a magnitude plus half a cell stays below the
    sign bit)."""
    import torch

    own = MANTISSA_BITS[dtype_name(real.dtype)]
    if bits >= own or real.numel() == 0:
        return real.clone()
    width = real.element_size() * 8
    view = {16: torch.int16, 32: torch.int32, 64: torch.int64}[width]
    half = 1 << (own - bits - 1)  # half a cell, in units of the dtype's own spacing
    pattern = real.view(view)
    magnitude = pattern & ((1 << (width - 1)) - 1)
    centre = (magnitude + half) & ~(2 * half - 1)
    offset = magnitude - centre  # in [-half, half): the side of the centre it lies on, and how far
    move = (half - offset.abs()).mul_(TOWARDS_EDGE_TENTHS).div_(10, rounding_mode="floor")
    move = move.where(offset > 0, -move)
    # NaN, infinity and a centre that rounds to infinity stay; so does a value on the grid (offset 0)
    move.masked_fill_((centre >= _infinity_pattern(real.dtype)) | (offset == 0), 0)
    return (pattern + move).view(real.dtype)


def _infinity_pattern(dtype: Any) -> int:
    """The bit pattern of +inf (the exponent all ones, the mantissa zero) of a real floating dtype."""
    import torch

    info = torch.finfo(dtype)
    mantissa = MANTISSA_BITS[dtype_name(dtype)]
    exponent_bits = info.bits - 1 - mantissa
    return ((1 << exponent_bits) - 1) << mantissa


def moved_call(pristine: tuple[tuple, dict], bits_of: dict[int, int]) -> tuple[tuple, dict]:
    """The call ``(args, kwargs)`` with each tensor whose ``id`` is in ``bits_of`` moved within its cells of
    that many bits; every other tensor copied as it is (layout kept)."""
    import torch

    from pytest_ditgate.correctness.roles import copy_like
    from pytest_ditgate.correctness.structure import map_tensors

    def visit(tensor: Any) -> Any:
        if not isinstance(tensor, torch.Tensor):
            return tensor
        bits = bits_of.get(id(tensor))
        return within_cells(tensor, bits) if bits is not None else copy_like(tensor)

    args, kwargs = pristine
    return map_tensors(args, visit), map_tensors(kwargs, visit)
