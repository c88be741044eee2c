"""Scaled-dot-product attention with an explicit backend, and a probe that records which kernel ran.

PyTorch picks an SDPA kernel per call and, under ``auto``, silently drops to the slow math path when a
fused one cannot run the shape. ``AttentionRecorder.probe`` runs one call under the CPU profiler once
per (shape, dtype, device, backend) and reads the dispatched aten op, so the model can report the
kernel that really ran and warn (or raise, when strict) on a fall-back to math.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: aten op name fragment -> backend name, most specific first
_OPS = (
    ("_scaled_dot_product_flash_attention_for_cpu", "flash_cpu"),
    ("_scaled_dot_product_flash_attention", "flash"),
    ("_scaled_dot_product_cudnn_attention", "cudnn"),
    ("_scaled_dot_product_efficient_attention", "efficient"),
    ("_scaled_dot_product_attention_math", "math"),
    ("_scaled_dot_product_fused_attention_overrideable", "overrideable"),
)
#: preference order of ``auto`` on CUDA (flash first; cudnn next, it is fast on Hopper)
_AUTO_ORDER = ("flash", "cudnn", "efficient", "math")


class AttentionFallback(RuntimeError):
    """A fused SDPA backend was asked for and the math path ran (raised only with ``strict``)."""


def backends_for(name: str) -> list[Any]:
    """``SDPBackend`` list for an option value: one backend, or the ``auto`` priority list."""
    from torch.nn.attention import SDPBackend

    table = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
             "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
    if name == "auto":
        return [table[n] for n in _AUTO_ORDER]
    return [table[name]]


def sdpa(q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor", backend: str) -> "torch.Tensor":
    """``F.scaled_dot_product_attention`` (no mask, no dropout) restricted to ``backend``."""
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    if backend == "auto":
        with sdpa_kernel(backends_for("auto"), set_priority=True):
            return F.scaled_dot_product_attention(q, k, v)
    with sdpa_kernel(backends_for(backend)):
        return F.scaled_dot_product_attention(q, k, v)


def dispatched_backend(q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor", backend: str) -> str:
    """Run one SDPA call under the profiler and name the kernel family it dispatched to."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
        sdpa(q, k, v, backend)
    names = [event.name for event in prof.events()]
    for fragment, label in _OPS:
        if any(fragment in name for name in names):
            return label
    return "unknown"


@dataclass
class AttentionRecorder:
    """Per-shape record of the requested and the dispatched SDPA backend of one model."""

    backend: str
    strict: bool = False
    seen: dict[str, dict[str, str]] = field(default_factory=dict)

    def probe(self, q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor") -> None:
        """Record (once per shape) which kernel ``backend`` dispatches to; warn or raise on math fall-back."""
        key = _key(q.shape, q.dtype, q.device)
        if key in self.seen or _tracing():
            return
        ran = dispatched_backend(q, k, v, self.backend)
        fallback = self.backend != "math" and ran == "math"
        self.seen[key] = {"requested": self.backend, "ran": ran, "fallback": str(fallback).lower()}
        if fallback:
            message = (f"SDPA backend {self.backend!r} fell back to the math path for q {tuple(q.shape)} "
                       f"{q.dtype} on {q.device}")
            if self.strict:
                raise AttentionFallback(message)
            warnings.warn(message, RuntimeWarning, stacklevel=3)

    def needs(self, shape: tuple[int, ...], dtype: "torch.dtype", device: "torch.device") -> bool:
        """True while this (q shape, dtype, device) has not been probed yet."""
        return _key(shape, dtype, device) not in self.seen

    def report(self) -> dict[str, Any]:
        return {"requested": self.backend, "shapes": dict(self.seen),
                "fallback": any(entry["fallback"] == "true" for entry in self.seen.values())}


def _key(shape: Any, dtype: Any, device: Any) -> str:
    return f"{tuple(shape)}:{str(dtype).replace('torch.', '')}:{device.type}"


def _tracing() -> bool:
    """True inside torch.compile tracing or CUDA graph capture, where the profiler must not run."""
    import torch

    if torch.compiler.is_compiling():
        return True
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
