"""Seeded test tensors in a chosen memory layout, for ``make_inputs`` functions and the strategies.

Kernels often break on layouts the happy path never sees: a transposed view, a strided slice, a view
with a storage offset. :func:`make_tensor` builds a tensor with the requested *logical* shape whose
memory is laid out that way, filled from a generator seeded on the target device (same seed, same values
on the same kind of device): nothing is drawn on the host for a CUDA tensor, and floating values are drawn
in float32 (float64 only for float64 tensors), so a 4096 x 128256 logits tensor costs a few milliseconds on
a GPU instead of seconds of host time and 4 GB of host memory.
"""

from __future__ import annotations

from typing import Any, Sequence

LAYOUTS = ("contiguous", "transposed", "strided", "offset", "channels_last")


def make_tensor(shape: Sequence[int], dtype: Any = "float32", *, seed: int = 0, layout: str = "contiguous",
                device: Any = "cpu", low: float | None = None, high: float | None = None) -> Any:
    """A tensor of ``shape`` and ``dtype`` laid out as ``layout``; normal values (uniform in [low, high)
    when both are given; integers in [low or 0, high or 100)). Layouts: ``contiguous``; ``transposed``
    (last two dims swapped in memory); ``strided`` (every other element of a twice-as-wide buffer);
    ``offset`` (a slice starting one row in); ``channels_last`` (4-d only, else contiguous)."""
    import torch

    from pytest_ditgate.arguments import describe, require_int
    from pytest_ditgate.dtypes import dtype_name
    from pytest_ditgate.errors import DitgateUsageError

    if layout not in LAYOUTS:
        raise DitgateUsageError(f"make_tensor: unknown layout {layout!r}; choose from {', '.join(LAYOUTS)}")
    if not isinstance(dtype, torch.dtype):
        found = getattr(torch, dtype_name(dtype), None) if isinstance(dtype, str) else None
        if not isinstance(found, torch.dtype):
            raise DitgateUsageError(f"make_tensor: dtype must be a torch.dtype or its name ('float32', 'bf16', ...), "
                                    f"got {describe(dtype)}")
        dtype = found
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__") or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise DitgateUsageError(f"make_tensor: shape must be a sequence of sizes >= 0 (like (33, 1152)), got "
                                f"{describe(shape)}")
    require_int(seed, "seed", "make_tensor")
    shape = tuple(int(s) for s in shape)
    if layout == "transposed" and len(shape) >= 2:
        storage_shape = shape[:-2] + (shape[-1], shape[-2])
    elif layout == "strided" and shape:
        storage_shape = shape[:-1] + (2 * shape[-1],)
    elif layout == "offset" and shape:
        storage_shape = (shape[0] + 1,) + shape[1:]
    else:
        storage_shape = shape
    device = torch.device(device)
    generator = torch.Generator(device=device).manual_seed(int(seed))
    draw = dict(generator=generator, device=device)
    if dtype.is_floating_point or dtype.is_complex:
        wide = torch.float64 if dtype in (torch.float64, torch.complex128) else torch.float32
        if low is not None and high is not None:
            base = torch.rand(storage_shape, dtype=wide, **draw).mul_(high - low).add_(low)
        else:
            base = torch.randn(storage_shape, dtype=wide, **draw)
    elif dtype is torch.bool:
        base = torch.rand(storage_shape, **draw) < 0.5
    else:
        base = torch.randint(int(low or 0), int(high or 100), storage_shape, **draw)
    base = base.to(dtype=dtype)
    if layout == "transposed" and len(shape) >= 2:
        return base.transpose(-1, -2)
    if layout == "strided" and shape:
        return base[..., ::2]
    if layout == "offset" and shape:
        return base[1:]
    if layout == "channels_last" and len(shape) == 4:
        return base.contiguous(memory_format=torch.channels_last)
    return base
