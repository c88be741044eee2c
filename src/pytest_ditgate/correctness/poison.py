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
``0x7FFFFFFF``), ``-1``/max for integers. :func:`poisoned_mask` finds elements still holding it. The CPU's
conversion of a NaN to bfloat16 gives ``0xFFFF`` too, so the candidate's second call on the same inputs is
poisoned with another pattern, :data:`SECOND_POISON_BYTE` (``0x7F`` bytes: a huge finite float32 or
bfloat16, a NaN in float16): an element that holds its call's pattern in one call and not the same bits in
the other was left unwritten; one that holds ``0xFF`` bytes in both was written (a NaN the kernel computed).
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

POISON_BYTE = 0xFF
#: the pattern of the candidate's second call (another pattern tells a computed all-ones NaN from poison)
SECOND_POISON_BYTE = 0x7F

_EMPTY_OPS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})


def fill_poison(tensor: torch.Tensor, byte: int = POISON_BYTE) -> None:
    """Overwrite all of ``tensor``'s storage with the poison pattern (bool tensors are left alone): a fresh
    allocation, all of whose storage is the kernel's."""
    if tensor.dtype is torch.bool or tensor.numel() == 0:
        return
    tensor.untyped_storage().fill_(byte)


def fill_view(tensor: torch.Tensor, byte: int = POISON_BYTE) -> None:
    """Overwrite the elements of ``tensor`` (its view only: the rest of its buffer may be another argument's
    or the caller's) with the poison pattern; bool tensors are left alone."""
    if tensor.dtype is torch.bool or tensor.numel() == 0:
        return
    pattern = torch.full((tensor.element_size(),), byte, dtype=torch.uint8, device=tensor.device)
    tensor.detach().copy_(pattern.view(tensor.dtype).reshape(()).expand(tensor.shape))


class PoisonEmpty(TorchDispatchMode):
    """While active, every uninitialised allocation through the dispatcher comes back poisoned (with ``byte``)."""

    def __init__(self, byte: int = POISON_BYTE) -> None:
        super().__init__()
        self.byte = byte

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
            fill_poison(out, self.byte)
        return out


#: whether this torch honours ``ignore_compile_internals`` (else compiled candidates run without the mode)
MODE_LETS_COMPILED_CODE_RUN = "ignore_compile_internals" in vars(TorchDispatchMode)


def looks_compiled(candidate: object) -> bool:
    """A ``torch.compile``d function or module (dynamo keeps the original callable on the wrapper)."""
    return hasattr(candidate, "_torchdynamo_orig_callable") or type(candidate).__name__ == "OptimizedModule"


def poison_free_memory(devices: Iterable[torch.device], sizes: Iterable[int], copies: int = 2,
                       byte: int = POISON_BYTE) -> None:
    """Allocate ``copies`` blocks of each byte size on each device, poison them and free them again."""
    sizes = sorted({int(size) for size in sizes if size > 0})
    for device in devices:
        blocks = []
        for size in sizes:
            for _ in range(copies):
                block = torch.empty(size, dtype=torch.uint8, device=device)
                block.fill_(byte)
                blocks.append(block)
        del blocks  # back to the caching allocator (CUDA) or the C allocator (CPU), full of poison


def poisoned_mask(tensor: torch.Tensor, byte: int = POISON_BYTE) -> torch.Tensor | None:
    """Boolean mask of elements whose bytes are all ``byte``; None for bool tensors."""
    if tensor.dtype is torch.bool:
        return None
    flat = tensor.detach().reshape(-1).contiguous()
    if flat.numel() == 0:
        return torch.zeros(tensor.shape, dtype=torch.bool, device=tensor.device)
    raw = flat.view(torch.uint8).reshape(flat.numel(), flat.element_size())
    return (raw == byte).all(dim=1).reshape(tensor.shape)
