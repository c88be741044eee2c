"""Watching the reference's float64 run for conversions to a lower precision.

A HuggingFace-style reference (``logits.float()``, ``hidden_states.to(torch.float32)``, then back to the
input dtype) computes in float32 during the run that is meant to be float64: the gate then measures an fp32
candidate against another fp32 computation, and its bound no longer says how far from the exact result a
kernel is. :class:`Downcasts` records every op that turns a float64 tensor into a float32/16-bit one while
the reference runs (first trial only, and not for ``torch.compile``d references, which a dispatch mode would
run eagerly); ``check_kernel`` notes it in the report and in any failure, and warns.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

_WIDE = (torch.float64, torch.complex128)


class Downcasts(TorchDispatchMode):
    """While active, counts ops (by name) with a float64 input and a lower-precision floating output."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __init__(self) -> None:
        super().__init__()
        self.seen: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's signature
        out = func(*args, **(kwargs or {}))
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if any(t.dtype in _WIDE for t in inputs):
            outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            if any((t.is_floating_point() or t.is_complex()) and t.dtype not in _WIDE for t in outputs):
                self.seen[f"aten.{func.overloadpacket.__name__}"] += 1
        return out

    def describe(self) -> str | None:
        """The note for the report, or None when the reference stayed in float64."""
        if not self.seen:
            return None
        ops = ", ".join(f"{name} x{count}" for name, count in sorted(self.seen.items()))
        return (f"the reference converted float64 tensors to a lower precision during its float64 run ({ops}): "
                "it computes in float32 (or less) there, so an fp32 candidate is measured against another fp32 "
                "computation; write it dtype-agnostic (no .float() / .to(torch.float32) on its inputs, e.g. "
                "x.to(torch.promote_types(x.dtype, torch.float32)))")
