"""Low-bit linears for the fast DiT's blocks (``FastOptions.quant``): the ``quantization`` class of experiment.

Every mode replaces the blocks' QKV, attention-out, fc1 and fc2 linears with a :class:`QuantizedLinear`
holding its weight in low bit (the conditioning, the patch embedding and the output projections stay as
they are). What each mode computes:

* ``int8_weight``: int8 weights with a symmetric scale per output channel, dequantized to the model's dtype
  on every call (the whole weight, each time: no faster than the model's own GEMMs);
* ``fp8_weight``: the same with float8 e4m3 weights;
* ``fp8``: fp8 GEMMs through ``torch._scaled_mm``, weights in e4m3 with a scale per output channel,
  activations quantized to e4m3 on the fly with a scale per token (row); bf16 out;
* ``fp8_tensor``: the same with one scale per weight and one per activation tensor;
* ``int4_noscale``: weights rounded to the int4 grid without a scale (a harmful control: a DiT's weights are
  mostly smaller than 0.5 and round to zero).

fp8 GEMMs run on NVIDIA GPUs of sm_89 or newer; elsewhere :func:`quantize_blocks` refuses the mode and says
why (:class:`QuantizationUnavailable`), unless ``FastOptions.fp8_emulate`` asks for the float stand-in: the
same roundings of weights and activations, computed by a float GEMM of the dequantized operands.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

#: largest finite float8 e4m3 value, and the int8 / int4 grids
FP8_MAX = 448.0
INT8_MAX = 127
INT4_MIN, INT4_MAX = -8, 7
#: modes whose GEMMs run in fp8 (``torch._scaled_mm``), and whether their scales are per tensor
FP8_GEMM_MODES = {"fp8": False, "fp8_tensor": True}
#: ``torch._scaled_mm`` needs both dimensions of its second operand (and the shared one) divisible by this
SCALED_MM_ALIGN = 16
#: the block linears each block holds, by attribute
BLOCK_LINEARS = ("qkv", "q", "k", "v", "out", "fc1", "fc2")


class QuantizationUnavailable(RuntimeError):
    """A quantization mode cannot run here (device, dtype or shape); the message says why."""


def fp8_gemm_support(device: Any) -> str | None:
    """Why fp8 GEMMs cannot run on ``device`` (None: they can)."""
    if device.type != "cuda":
        return f"fp8 GEMMs (torch._scaled_mm) need an NVIDIA GPU of sm_89 or newer; the model is on {device.type}"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        return f"fp8 GEMMs (torch._scaled_mm) need sm_89 or newer; this device is sm_{major}{minor}"
    return None


def _per_channel_scale(weight: torch.Tensor, top: float) -> torch.Tensor:
    return (weight.float().abs().amax(dim=1) / top).clamp(min=1e-12)


def _to_fp8(values: torch.Tensor) -> torch.Tensor:
    return values.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


class QuantizedLinear(nn.Module):
    """``linear(x)`` with a low-bit weight (``mode`` as in the module docstring); the bias stays in the model's
    dtype. ``emulate`` computes an fp8 mode with a float GEMM of the dequantized operands."""

    def __init__(self, linear: nn.Linear, mode: str, *, emulate: bool = False) -> None:
        super().__init__()
        weight = linear.weight.detach()
        self.mode, self.emulate = mode, emulate
        self.out_features, self.in_features = weight.shape
        self.compute_dtype = weight.dtype
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        if mode == "int8_weight":
            scale = _per_channel_scale(weight, INT8_MAX)
            stored = (weight.float() / scale[:, None]).round().clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
        elif mode == "int4_noscale":
            scale = None
            stored = weight.float().round().clamp(INT4_MIN, INT4_MAX).to(torch.int8)
        elif mode in ("fp8_weight", "fp8"):
            scale = _per_channel_scale(weight, FP8_MAX)
            stored = _to_fp8(weight.float() / scale[:, None])
        elif mode == "fp8_tensor":
            scale = (weight.float().abs().amax() / FP8_MAX).clamp(min=1e-12)
            stored = _to_fp8(weight.float() / scale)
        else:
            raise ValueError(f"unknown quantization mode {mode!r}")
        self.register_buffer("weight_q", stored)
        self.register_buffer("weight_scale", scale)

    def extra_repr(self) -> str:
        return (f"{self.in_features}, {self.out_features}, mode={self.mode}"
                + (", emulated" if self.emulate else ""))

    def dequantized_weight(self) -> torch.Tensor:
        weight = self.weight_q.to(torch.float32)
        if self.weight_scale is not None:
            weight = weight * (self.weight_scale[:, None] if self.weight_scale.dim() else self.weight_scale)
        return weight.to(self.compute_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode not in FP8_GEMM_MODES:
            return F.linear(x, self.dequantized_weight(), self.bias)
        flat = x.reshape(-1, x.shape[-1])
        per_tensor = FP8_GEMM_MODES[self.mode]
        amax = flat.float().abs().amax() if per_tensor else flat.float().abs().amax(dim=1, keepdim=True)
        x_scale = (amax / FP8_MAX).clamp(min=1e-12)
        x_q = _to_fp8(flat.float() / x_scale)
        if self.emulate:
            out = F.linear((x_q.to(torch.float32) * x_scale).to(self.compute_dtype), self.dequantized_weight(),
                           self.bias)
        else:
            w_scale = self.weight_scale if per_tensor else self.weight_scale[None, :]
            out = torch._scaled_mm(x_q, self.weight_q.t(), scale_a=x_scale, scale_b=w_scale,
                                   out_dtype=torch.bfloat16)
            out = out.to(self.compute_dtype)
            if self.bias is not None:
                out = out + self.bias
        return out.view(*x.shape[:-1], self.out_features)


def _check_fp8_shapes(mode: str, linear: nn.Linear, where: str) -> None:
    out_features, in_features = linear.weight.shape
    if in_features % SCALED_MM_ALIGN or out_features % SCALED_MM_ALIGN:
        raise QuantizationUnavailable(f"quant={mode!r}: {where} is {in_features}x{out_features}; fp8 GEMMs need "
                                      f"both sizes divisible by {SCALED_MM_ALIGN}")


def quantize_blocks(model: Any, mode: str, *, emulate: bool = False) -> str:
    """Replace the linears of ``model.transformer_blocks`` by :class:`QuantizedLinear` of ``mode`` (in place);
    returns what ran, for the model's report. Raises :class:`QuantizationUnavailable` naming the reason when
    an fp8 GEMM mode cannot run on the model's device (and ``emulate`` is off)."""
    if mode == "none":
        return "off"
    fp8_gemms = mode in FP8_GEMM_MODES
    if fp8_gemms and not emulate:
        why = fp8_gemm_support(model.device)
        if why:
            raise QuantizationUnavailable(f"quant={mode!r}: {why} (FastOptions.fp8_emulate=True runs the same "
                                          "roundings as float GEMMs, for quality only)")
        if model.dtype not in (torch.bfloat16, torch.float32):
            raise QuantizationUnavailable(f"quant={mode!r}: fp8 GEMMs here give bf16 out; the model is "
                                          f"{str(model.dtype).replace('torch.', '')} (use bfloat16 or float32)")
    count = 0
    for index, block in enumerate(model.transformer_blocks):
        for name in BLOCK_LINEARS:
            linear = getattr(block, name, None)
            if not isinstance(linear, nn.Linear):
                continue
            if fp8_gemms:
                _check_fp8_shapes(mode, linear, f"block {index}'s {name}")
            setattr(block, name, QuantizedLinear(linear, mode, emulate=emulate))
            count += 1
    how = ("float GEMMs of the dequantized fp8 operands (emulated)" if fp8_gemms and emulate else
           "torch._scaled_mm fp8 GEMMs" if fp8_gemms else "dequantized to the model's dtype on every call")
    return f"{mode}: {count} block linears, {how}"
