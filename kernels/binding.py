"""The binding layer: validate tensors, then call a module's C launcher with raw pointers and the stream.

Every check names the function and the tensor. Order: types, shapes, dtypes, layout, devices, so that
shape and dtype errors are reported the same on a machine without a GPU.
"""

from __future__ import annotations

import ctypes
from typing import Any, Sequence

import torch

from kernels.modules import get_module

DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}

I64 = ctypes.c_int64
PTR = ctypes.c_void_p
F32 = ctypes.c_float


class KernelInputError(ValueError):
    """A tensor passed to a kernel API has the wrong type, shape, dtype, layout or device."""


def _fail(fn: str, message: str) -> None:
    raise KernelInputError(f"{fn}: {message}")


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def check_activation(fn: str, name: str, t: Any, like: torch.Tensor | None = None) -> None:
    """``t`` is a [B, N, H] tensor of a supported dtype (and matches ``like``'s shape and dtype)."""
    if not isinstance(t, torch.Tensor):
        _fail(fn, f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if like is None:
        if t.dim() != 3:
            _fail(fn, f"{name} must have shape (B, N, H), got {_shape(t)}")
        if t.shape[-1] == 0:
            _fail(fn, f"{name} has hidden size 0")
        if t.dtype not in DTYPE_NAMES:
            _fail(fn, f"{name} has dtype {t.dtype}; supported: float32, float16, bfloat16")
    else:
        if _shape(t) != _shape(like):
            _fail(fn, f"{name} must have the shape of x {_shape(like)}, got {_shape(t)}")
        if t.dtype != like.dtype:
            _fail(fn, f"{name} has dtype {t.dtype} but x has {like.dtype}; all tensors must share one dtype")


def check_rows(fn: str, name: str, t: Any, x: torch.Tensor) -> None:
    """``t`` is a [B, H] modulation tensor for ``x`` with unit stride along H (a batch stride is fine)."""
    if not isinstance(t, torch.Tensor):
        _fail(fn, f"{name} must be a torch.Tensor, got {type(t).__name__}")
    expected = (x.shape[0], x.shape[-1])
    if _shape(t) != expected:
        _fail(fn, f"{name} must have shape (B, H) = {expected} for x of shape {_shape(x)}, got {_shape(t)}")
    if t.dtype != x.dtype:
        _fail(fn, f"{name} has dtype {t.dtype} but x has {x.dtype}; all tensors must share one dtype")
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        _fail(fn, f"{name} must be contiguous along H (stride(-1) == 1), got strides {t.stride()}")


def check_contiguous(fn: str, tensors: dict[str, torch.Tensor]) -> None:
    for name, t in tensors.items():
        if not t.is_contiguous():
            _fail(fn, f"{name} must be contiguous (shape {_shape(t)}, strides {t.stride()}); call .contiguous()")


def check_devices(fn: str, tensors: dict[str, torch.Tensor]) -> torch.device:
    first = next(iter(tensors.values())).device
    for name, t in tensors.items():
        if t.device.type != "cuda":
            _fail(fn, f"{name} must be on a CUDA device, got {t.device}")
        if t.device != first:
            _fail(fn, f"{name} is on {t.device} but x is on {first}; all tensors must be on one device")
    return first


def batch_stride(t: torch.Tensor) -> int:
    return t.stride(0) if t.shape[0] > 1 else t.shape[-1]


def launch(fn: str, op: str, symbol: str, dtype: torch.dtype, device: torch.device,
           argtypes: Sequence[Any], args: Sequence[Any]) -> None:
    """Call ``symbol`` of the (op, dtype) module on ``device``'s current stream; raise on a CUDA error."""
    module = get_module(op, DTYPE_NAMES[dtype])
    launcher = module.function(symbol, list(argtypes) + [PTR])
    with torch.cuda.device(device):
        stream = torch.cuda.current_stream(device).cuda_stream
        code = launcher(*args, stream)
    if code != 0:
        text = module.function("ditgate_error_string", [ctypes.c_int], ctypes.c_char_p)(code)
        raise RuntimeError(f"{fn}: CUDA error {code} ({(text or b'?').decode()}) from {module.name}:{symbol} "
                           f"on {device}")
