"""Poison: make unwritten output memory recognisable, so a kernel that leaves elements unwritten fails.

A kernel that returns ``torch.empty`` memory without writing all of it can pass by luck: the allocator
often hands back the block that held the reference's (or its own previous) result. Two layers close that:

* :class:`PoisonEmpty` (a ``TorchDispatchMode``) fills every tensor created by ``empty``/``empty_like``/
  ``empty_strided``/``new_empty`` while the candidate runs with the poison byte pattern, deterministic on
  any device;
* :func:`poison_free_memory` fills blocks of the sizes the candidate is likely to allocate and frees them,
  so the CUDA caching allocator (or, best effort, the CPU allocator) hands poison back to allocations
  made outside the dispatcher.

The pattern is all bytes ``0xFF``: a NaN in every floating format (negative, unlike CUDA's canonical NaN
``0x7FFFFFFF``), ``-1``/max for integers. :func:`poisoned_mask` finds elements still holding it.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

POISON_BYTE = 0xFF

_EMPTY_OPS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})


def fill_poison(tensor: torch.Tensor) -> None:
    """Overwrite all of ``tensor``'s storage with the poison pattern (bool tensors are left alone)."""
    if tensor.dtype is torch.bool or tensor.numel() == 0:
        return
    tensor.untyped_storage().fill_(POISON_BYTE)


class PoisonEmpty(TorchDispatchMode):
    """While active, every uninitialised allocation through the dispatcher comes back poisoned."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Let ``torch.compile``d candidates run their compiled code under this mode.

        Otherwise dynamo skips any frame under an active dispatch mode, so a compiled candidate would be
        checked as eager code (and, before torch's fix for that skip, stay eager for the whole process).
        Buffers the compiled code allocates are still covered by the poisoned free memory.
        """
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's signature
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ in _EMPTY_OPS and isinstance(out, torch.Tensor):
            fill_poison(out)
        return out


#: whether this torch honours ``ignore_compile_internals`` (else compiled candidates run without the mode)
MODE_LETS_COMPILED_CODE_RUN = "ignore_compile_internals" in vars(TorchDispatchMode)


def looks_compiled(candidate: object) -> bool:
    """A ``torch.compile``d function or module (dynamo keeps the original callable on the wrapper)."""
    return hasattr(candidate, "_torchdynamo_orig_callable") or type(candidate).__name__ == "OptimizedModule"


def poison_free_memory(devices: Iterable[torch.device], sizes: Iterable[int], copies: int = 2) -> None:
    """Allocate ``copies`` blocks of each byte size on each device, poison them and free them again."""
    sizes = sorted({int(size) for size in sizes if size > 0})
    for device in devices:
        blocks = []
        for size in sizes:
            for _ in range(copies):
                block = torch.empty(size, dtype=torch.uint8, device=device)
                block.fill_(POISON_BYTE)
                blocks.append(block)
        del blocks  # back to the caching allocator (CUDA) or the C allocator (CPU), full of poison


def poisoned_mask(tensor: torch.Tensor) -> torch.Tensor | None:
    """Boolean mask of elements whose bytes are all the poison byte; None for bool tensors."""
    if tensor.dtype is torch.bool:
        return None
    flat = tensor.detach().reshape(-1).contiguous()
    if flat.numel() == 0:
        return torch.zeros(tensor.shape, dtype=torch.bool, device=tensor.device)
    raw = flat.view(torch.uint8).reshape(flat.numel(), flat.element_size())
    return (raw == POISON_BYTE).all(dim=1).reshape(tensor.shape)
