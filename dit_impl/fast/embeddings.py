"""Fixed (parameter-free) embeddings of DiT, computed with diffusers' arithmetic so float32 matches bit for bit.

``timestep_features``: the 256-channel sinusoidal timestep projection (cos first, frequency shift 1);
``patch_positions``: the 2-D sin-cos position table added after the patch projection.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

TIMESTEP_CHANNELS = 256


def timestep_features(timesteps: "torch.Tensor", channels: int = TIMESTEP_CHANNELS,
                      max_period: int = 10000) -> "torch.Tensor":
    """[B] timesteps -> [B, channels] float32 features ``[cos(t f), sin(t f)]``, f = exp(-ln(P) i / (half-1))."""
    import torch

    half = channels // 2
    exponent = -math.log(max_period) * torch.arange(0, half, dtype=torch.float32, device=timesteps.device)
    exponent = exponent / (half - 1)
    angles = timesteps[:, None].float() * torch.exp(exponent)[None, :]
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)


def _axis_table(dim: int, positions: "torch.Tensor") -> "torch.Tensor":
    import torch

    omega = torch.arange(dim // 2, dtype=torch.float64, device=positions.device)
    omega /= dim / 2.0
    omega = 1.0 / 10000**omega
    angles = torch.outer(positions.reshape(-1), omega)
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)


def patch_positions(dim: int, grid: int) -> "torch.Tensor":
    """[1, grid*grid, dim] float32 2-D sin-cos table, row-major over (row, column) patches."""
    import torch

    coords = torch.arange(grid, dtype=torch.float32)
    cols, rows = torch.meshgrid(coords, coords, indexing="xy")  # cols varies fastest, as the tokens do
    table = torch.cat([_axis_table(dim // 2, cols), _axis_table(dim // 2, rows)], dim=1)
    return table.float().unsqueeze(0)
