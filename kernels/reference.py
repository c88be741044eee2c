"""PyTorch references of every kernel (also the eager baselines of the benchmarks).

They compute in the dtype they are given: the correctness gate passes float64 copies.
"""

from __future__ import annotations

from typing import Any


def layernorm_modulate_ref(x: Any, scale: Any, shift: Any, eps: float = 1e-6) -> Any:
    """``layer_norm(x) * (1 + scale) + shift`` with scale, shift [B, H] broadcast over tokens."""
    import torch.nn.functional as F

    return F.layer_norm(x, x.shape[-1:], eps=eps) * (1 + scale[:, None, :]) + shift[:, None, :]


def gated_residual_ref(x: Any, gate: Any, y: Any) -> Any:
    """``x + gate * y`` with gate [B, H] broadcast over tokens."""
    return x + gate[:, None, :] * y


def gated_residual_layernorm_modulate_ref(x: Any, gate: Any, y: Any, scale: Any, shift: Any,
                                          eps: float = 1e-6) -> tuple[Any, Any]:
    """The DiT block's residual then the next norm: ``(x_new, layernorm_modulate(x_new))``."""
    x_new = gated_residual_ref(x, gate, y)
    return x_new, layernorm_modulate_ref(x_new, scale, shift, eps)
