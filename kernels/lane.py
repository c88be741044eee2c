"""The kernel lane's candidate (``[tool.ditgate.lanes.kernels]``, docs/agent_loop.md): the seam of a DiT block.

Between a block's attention and its MLP the residual stream takes the gated attention output, and the MLP's
input is that stream layer-normalised and adaLN-modulated: ``x_new = x + gate * y``, ``out =
layernorm_modulate(x_new, scale, shift)``. The lane (``tests/gates/kernels/test_kernel_lane.py``) judges
:func:`seam` against a PyTorch reference of the same arithmetic: its outputs against the goldens frozen by
``ditgate baseline --lane kernels``, its time against the reference's and the lane best's. This file and the
kernels under ``kernels/`` are mutable paths: an experiment edits them.

``SEAM`` picks the kernels: ``"separate"`` runs the gated residual, then the LayerNorm + modulation (two
launches, ``x_new`` written and read back); ``"fused"`` runs both in one pass
(``gated_residual_layernorm_modulate``).
"""

from __future__ import annotations

from typing import Any

#: how the seam runs: "separate" (two kernels) or "fused" (one)
SEAM = "separate"
SEAMS = ("separate", "fused")


def seam_for(how: str) -> Any:
    """The seam as ``how`` runs it: ``(x, gate, y, scale, shift, eps) -> (x_new, out)``."""
    import kernels

    if how not in SEAMS:
        raise ValueError(f"unknown seam {how!r}; choose from {', '.join(SEAMS)}")

    def separate(x: Any, gate: Any, y: Any, scale: Any, shift: Any, eps: float = 1e-6) -> tuple[Any, Any]:
        x_new = kernels.gated_residual(x, gate, y)
        return x_new, kernels.layernorm_modulate(x_new, scale, shift, eps)

    return kernels.gated_residual_layernorm_modulate if how == "fused" else separate


def seam(x: Any, gate: Any, y: Any, scale: Any, shift: Any, eps: float = 1e-6) -> tuple[Any, Any]:
    """The candidate's seam: ``SEAM``'s kernels."""
    return seam_for(SEAM)(x, gate, y, scale, shift, eps)
