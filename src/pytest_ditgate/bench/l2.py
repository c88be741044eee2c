"""Cold-L2 support: a flush buffer sized from the device's real L2, and input rotation for graphs.

Inside a CUDA graph a flush between calls would be timed with the call, so graph mode instead cycles
through enough copies of the tensor arguments that their working set exceeds L2 several times over.
"""

from __future__ import annotations

import math
from typing import Any

#: the flush buffer and the rotated working set are this many times the L2 size
L2_FACTOR = 2
#: used when the device does not report its L2 size
DEFAULT_L2_BYTES = 64 * 2**20
#: rotation never holds more copies than this, whatever the sizes
MAX_COPIES = 512

L2_MODES = ("warm", "cold")


def check_mode(mode: str) -> str:
    from pytest_ditgate.errors import DitgateUsageError

    if mode not in L2_MODES:
        raise DitgateUsageError(f"l2={mode!r}: choose 'warm' or 'cold'")
    return mode


def flush_bytes(l2_bytes: int | None) -> int:
    """Size of the buffer whose rewrite evicts everything else from L2."""
    return L2_FACTOR * (l2_bytes or DEFAULT_L2_BYTES)


class L2Flusher:
    """Overwrites a buffer of :func:`flush_bytes` on the current stream (call it between timed calls)."""

    def __init__(self, l2_bytes: int | None, device: Any) -> None:
        import torch

        self.nbytes = flush_bytes(l2_bytes)
        self._buffer = torch.empty(self.nbytes // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        self._buffer.zero_()


def tensor_bytes(values: Any) -> int:
    """Bytes of every tensor found in ``values`` (nested lists, tuples and dict values)."""
    import torch

    if isinstance(values, torch.Tensor):
        return values.numel() * values.element_size()
    if isinstance(values, (list, tuple)):
        return sum(tensor_bytes(v) for v in values)
    if isinstance(values, dict):
        return sum(tensor_bytes(v) for v in values.values())
    return 0


def rotation_count(arg_bytes: int, l2_bytes: int | None, free_bytes: int | None = None) -> int:
    """How many copies of the arguments make a working set of at least ``L2_FACTOR`` x L2.

    Raises ValueError when there are no tensor arguments or the copies would not fit in half the free memory.
    """
    if arg_bytes <= 0:
        raise ValueError("cold L2 in graph mode rotates tensor arguments, and this call has none")
    need = math.ceil(flush_bytes(l2_bytes) / arg_bytes) + 1
    copies = max(2, min(need, MAX_COPIES))
    if copies * arg_bytes < flush_bytes(l2_bytes):
        raise ValueError(f"{MAX_COPIES} copies of {arg_bytes} bytes of arguments do not exceed L2")
    if free_bytes is not None and copies * arg_bytes > free_bytes // 2:
        raise ValueError(f"{copies} argument copies ({copies * arg_bytes / 2**20:.0f} MiB) do not fit in memory")
    return copies


def clone_tensors(values: Any) -> Any:
    """A copy of ``values`` in which every tensor is cloned (other objects are shared)."""
    import torch

    if isinstance(values, torch.Tensor):
        return values.clone()
    if isinstance(values, list):
        return [clone_tensors(v) for v in values]
    if isinstance(values, tuple):
        return tuple(clone_tensors(v) for v in values)
    if isinstance(values, dict):
        return {k: clone_tensors(v) for k, v in values.items()}
    return values
