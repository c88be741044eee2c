"""Gated residual of a DiT block, ``x + gate * y`` (public API)."""

from __future__ import annotations

import torch

from kernels import binding
from kernels.binding import I64, PTR
from kernels.jit.api_log import api_log


@api_log
def gated_residual(x: torch.Tensor, gate: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``x + gate * y``; x, y [B, N, H], gate [B, H] broadcast over tokens; fp32 arithmetic, one rounding."""
    fn = "gated_residual"
    binding.check_activation(fn, "x", x)
    binding.check_activation(fn, "y", y, like=x)
    binding.check_rows(fn, "gate", gate, x)
    binding.check_contiguous(fn, {"x": x, "y": y})
    device = binding.check_devices(fn, {"x": x, "gate": gate, "y": y})
    out = torch.empty_like(x)
    if out.numel() == 0:
        return out
    B, N, H = x.shape
    binding.launch(fn, "gated_residual", "ditgate_gated_residual", x.dtype, device,
                   [PTR, PTR, I64, PTR, PTR, I64, I64, I64],
                   [x.data_ptr(), gate.data_ptr(), binding.batch_stride(gate), y.data_ptr(), out.data_ptr(),
                    B, N, H])
    return out
