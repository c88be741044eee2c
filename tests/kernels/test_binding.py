"""The binding layer rejects bad tensors with messages naming the function and the tensor (no GPU needed)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import kernels  # noqa: E402
from kernels.binding import KernelInputError  # noqa: E402


def _t(*shape, dtype=torch.bfloat16):
    return torch.zeros(*shape, dtype=dtype)


GOOD = {"x": _t(2, 4, 8), "y": _t(2, 4, 8), "gate": _t(2, 8), "scale": _t(2, 8), "shift": _t(2, 8)}


def _call(op: str, **changes):
    args = {**GOOD, **changes}
    if op == "layernorm_modulate":
        return kernels.layernorm_modulate(args["x"], args["scale"], args["shift"], **args.get("kw", {}))
    if op == "gated_residual":
        return kernels.gated_residual(args["x"], args["gate"], args["y"])
    return kernels.gated_residual_layernorm_modulate(args["x"], args["gate"], args["y"], args["scale"], args["shift"])


@pytest.mark.parametrize("op, changes, message", [
    ("layernorm_modulate", {"x": _t(8, 8)}, "layernorm_modulate: x must have shape (B, N, H), got (8, 8)"),
    ("layernorm_modulate", {"x": _t(2, 4, 8, dtype=torch.int32)}, "x has dtype torch.int32"),
    ("layernorm_modulate", {"scale": _t(2, 9)}, "scale must have shape (B, H) = (2, 8)"),
    ("layernorm_modulate", {"shift": _t(2, 8, dtype=torch.float16)}, "shift has dtype torch.float16 but x has"),
    ("layernorm_modulate", {"scale": _t(2, 16)[:, ::2]}, "scale must be contiguous along H"),
    ("layernorm_modulate", {"x": _t(2, 8, 4).transpose(1, 2)}, "x must be contiguous"),
    ("layernorm_modulate", {"scale": [0.0] * 8}, "scale must be a torch.Tensor, got list"),
    ("layernorm_modulate", {"kw": {"eps": 0.0}}, "eps must be a positive finite number"),
    ("layernorm_modulate", {}, "x must be on a CUDA device, got cpu"),
    ("gated_residual", {"y": _t(2, 4, 7)}, "gated_residual: y must have the shape of x (2, 4, 8), got (2, 4, 7)"),
    ("gated_residual", {"gate": _t(3, 8)}, "gate must have shape (B, H) = (2, 8)"),
    ("gated_residual", {}, "must be on a CUDA device"),
    ("gated_residual_layernorm_modulate", {"y": _t(2, 4, 8, dtype=torch.float32)},
     "y has dtype torch.float32 but x has torch.bfloat16"),
    ("gated_residual_layernorm_modulate", {"shift": _t(1, 8)}, "shift must have shape (B, H) = (2, 8)"),
])
def test_bad_inputs_are_named(op, changes, message) -> None:
    with pytest.raises(KernelInputError) as info:
        _call(op, **changes)
    assert message in str(info.value)


def test_modulation_rows_may_be_chunks_of_one_tensor() -> None:
    """DiT's adaLN makes scale/shift as chunks of [B, 6H]: accepted up to the device check."""
    scale, shift = _t(2, 48).chunk(6, dim=1)[:2]
    with pytest.raises(KernelInputError, match="CUDA device"):
        kernels.layernorm_modulate(GOOD["x"], scale, shift)
