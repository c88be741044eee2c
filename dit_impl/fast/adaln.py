"""adaLN pieces of a DiT block: LayerNorm (no affine) + modulate, and the gated residual.

Two implementations behind one interface: PyTorch ops (any device, the reference arithmetic of
diffusers), and the fused CUDA kernels of the repository's ``kernels`` package when it is importable
and the tensors are on CUDA. ``resolve_ops`` decides once and says why, so a fall-back is reported.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from pytest_ditgate.bench.rated import rated

if TYPE_CHECKING:
    import torch

#: names the kernels package may give each op, first found wins
_KERNEL_NAMES = {
    "norm_modulate": ("layernorm_modulate",),
    "gated_residual": ("gated_residual",),
    "residual_norm_modulate": ("gated_residual_layernorm_modulate",),
}


def norm_modulate(x: "torch.Tensor", shift: "torch.Tensor", scale: "torch.Tensor", eps: float) -> "torch.Tensor":
    """``layer_norm(x) * (1 + scale) + shift`` with shift/scale [B, D] broadcast over tokens (diffusers order)."""
    import torch.nn.functional as F

    return F.layer_norm(x, x.shape[-1:], eps=eps) * (1 + scale[:, None]) + shift[:, None]


def gated_residual(x: "torch.Tensor", gate: "torch.Tensor", y: "torch.Tensor") -> "torch.Tensor":
    """``gate * y + x`` with gate [B, D] broadcast over tokens (diffusers rounds the product first)."""
    return gate[:, None] * y + x


def residual_norm_modulate(x: "torch.Tensor", gate: "torch.Tensor", y: "torch.Tensor", shift: "torch.Tensor",
                           scale: "torch.Tensor", eps: float) -> tuple["torch.Tensor", "torch.Tensor"]:
    """``x_new = gated_residual(x, gate, y)`` and ``norm_modulate(x_new, ...)``: the attention-to-MLP seam."""
    x_new = gated_residual(x, gate, y)
    return x_new, norm_modulate(x_new, shift, scale, eps)


@dataclass(frozen=True)
class AdalnOps:
    """The chosen implementation and the reason it was chosen (reported by the model)."""

    norm_modulate: Callable[..., Any]  # (x, shift, scale, eps) -> out
    gated_residual: Callable[..., Any]  # (x, gate, y) -> x_new
    residual_norm_modulate: Callable[..., Any]  # (x, gate, y, shift, scale, eps) -> (x_new, out)
    impl: str  # "torch" or "kernels"
    reason: str


def torch_ops(reason: str) -> AdalnOps:
    # lambdas, not the functions: the module globals are looked up at call time, so a test can replace
    # one op with monkeypatch.setattr(adaln, ...) (a deliberate fault) after the model was built
    return AdalnOps(lambda *a: norm_modulate(*a), lambda *a: gated_residual(*a),
                    lambda *a: residual_norm_modulate(*a), "torch", reason)


def _find(package: Any, op: str) -> Callable[..., Any] | None:
    for name in _KERNEL_NAMES[op]:
        fn = getattr(package, name, None)
        if callable(fn):
            return fn
    return None


def resolve_ops(mode: str, device_type: str, compiled: bool) -> AdalnOps:
    """Pick PyTorch or the ``kernels`` package for ``mode`` (torch/kernels/auto); never raises for auto."""
    if mode == "torch":
        return torch_ops("requested")
    if device_type != "cuda":
        return torch_ops(f"kernels need CUDA tensors, model is on {device_type}")
    if compiled:
        return torch_ops("compiled blocks: inductor fuses these ops itself")
    return package_ops()


def package_ops() -> AdalnOps:
    """The ``kernels`` package's ops, or PyTorch's with the reason it is unusable. Its own function, so that a
    run that never asks for the kernels never executes their import (the GPU check keys a run on what ran)."""
    try:
        package = importlib.import_module("kernels")
    except Exception as exc:  # noqa: BLE001 - any import failure means the fallback, with its reason
        return torch_ops(f"kernels package not importable: {type(exc).__name__}: {exc}")
    found = {op: _find(package, op) for op in _KERNEL_NAMES}
    missing = [op for op, fn in found.items() if fn is None]
    if missing:
        wanted = "; ".join(f"{op}: one of {', '.join(_KERNEL_NAMES[op])}" for op in missing)
        return torch_ops(f"kernels package lacks {wanted}")
    return kernel_ops(found["norm_modulate"], found["gated_residual"], found["residual_norm_modulate"])


def _bytes(*tensors: "torch.Tensor") -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def kernel_ops(nm: Callable[..., Any], gr: Callable[..., Any], fused: Callable[..., Any]) -> AdalnOps:
    """The ``kernels`` package's ops, each launch ``rated`` with the bytes it reads and writes: they launch
    through the package's own binding, not a torch op, so a phase profile would have no GB/s for them."""

    def norm_modulate_k(x: Any, shift: Any, scale: Any, eps: float) -> Any:
        with rated("adaln norm_modulate", bytes=2 * _bytes(x) + _bytes(shift, scale)):
            return nm(x, scale=scale, shift=shift, eps=eps)

    def gated_residual_k(x: Any, gate: Any, y: Any) -> Any:
        with rated("adaln gated_residual", bytes=2 * _bytes(x) + _bytes(y, gate)):
            return gr(x, gate, y)

    def residual_norm_modulate_k(x: Any, gate: Any, y: Any, shift: Any, scale: Any, eps: float) -> Any:
        with rated("adaln residual_norm_modulate", bytes=3 * _bytes(x) + _bytes(y, gate, shift, scale)):
            return fused(x, gate, y, scale=scale, shift=shift, eps=eps)

    return AdalnOps(norm_modulate_k, gated_residual_k, residual_norm_modulate_k, "kernels",
                    f"kernels.{nm.__name__}, {fused.__name__}, {gr.__name__}")
