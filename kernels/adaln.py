"""LayerNorm + adaLN modulation, alone and fused after the gated residual (public API)."""

from __future__ import annotations

import math

import torch

from kernels import binding
from kernels.binding import F32, I64, PTR
from kernels.jit.api_log import api_log


def _check_eps(fn: str, eps: float) -> float:
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
        raise binding.KernelInputError(f"{fn}: eps must be a positive finite number, got {eps!r}")
    return float(eps)


@api_log
def layernorm_modulate(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``layer_norm(x, no affine) * (1 + scale) + shift``; x [B, N, H], scale/shift [B, H]; fp32 statistics."""
    fn = "layernorm_modulate"
    binding.check_activation(fn, "x", x)
    binding.check_rows(fn, "scale", scale, x)
    binding.check_rows(fn, "shift", shift, x)
    binding.check_contiguous(fn, {"x": x})
    eps = _check_eps(fn, eps)
    device = binding.check_devices(fn, {"x": x, "scale": scale, "shift": shift})
    out = torch.empty_like(x)
    if out.numel() == 0:
        return out
    B, N, H = x.shape
    binding.launch(fn, "adaln", "ditgate_layernorm_modulate", x.dtype, device,
                   [PTR, PTR, I64, PTR, I64, PTR, I64, I64, I64, F32],
                   [x.data_ptr(), scale.data_ptr(), binding.batch_stride(scale), shift.data_ptr(),
                    binding.batch_stride(shift), out.data_ptr(), B, N, H, eps])
    return out


@api_log
def gated_residual_layernorm_modulate(x: torch.Tensor, gate: torch.Tensor, y: torch.Tensor, scale: torch.Tensor,
                                      shift: torch.Tensor, eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """One pass of ``x_new = x + gate * y; out = layernorm_modulate(x_new)``; returns ``(x_new, out)``."""
    fn = "gated_residual_layernorm_modulate"
    binding.check_activation(fn, "x", x)
    binding.check_activation(fn, "y", y, like=x)
    for name, t in (("gate", gate), ("scale", scale), ("shift", shift)):
        binding.check_rows(fn, name, t, x)
    binding.check_contiguous(fn, {"x": x, "y": y})
    eps = _check_eps(fn, eps)
    device = binding.check_devices(fn, {"x": x, "gate": gate, "y": y, "scale": scale, "shift": shift})
    x_new = torch.empty_like(x)
    out = torch.empty_like(x)
    if out.numel() == 0:
        return x_new, out
    B, N, H = x.shape
    binding.launch(fn, "adaln", "ditgate_gated_residual_layernorm_modulate", x.dtype, device,
                   [PTR, PTR, I64, PTR, PTR, I64, PTR, I64, PTR, PTR, I64, I64, I64, F32],
                   [x.data_ptr(), gate.data_ptr(), binding.batch_stride(gate), y.data_ptr(), scale.data_ptr(),
                    binding.batch_stride(scale), shift.data_ptr(), binding.batch_stride(shift), x_new.data_ptr(),
                    out.data_ptr(), B, N, H, eps])
    return x_new, out
