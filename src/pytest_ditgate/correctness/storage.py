"""The inputs' memory: pristine copies in each input's own layout, and writes outside an input's view.

An input may be a view of a larger buffer: a slice of a KV cache, every other element of a row, a tensor at
a storage offset. A kernel reads it through its strides and offset, so the copies the gate calls the candidate
on later (the precision probe's) keep them; and a kernel that writes into the buffer outside the view (the
slot after a cache's end, the gaps of a strided view, the elements before an offset) clobbers the caller's
memory although every element of the view is right.

Before a trial's first call, the storage of every such input is copied once, byte for byte (one copy per
storage, however many inputs view it); the inputs' pristine copies are views of that copy with the inputs'
own shapes, strides and storage offsets. After each of the candidate's calls the storage is compared with the
copy outside the inputs' views (a change inside a view is the value checks' to judge). An input that is the
whole of its own storage (a dense tensor at offset 0) has nothing outside its view: its pristine copy is a
plain clone, which keeps its strides, and nothing more is held for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Outside:
    """Bytes of a storage that changed outside every input's view: which inputs view it, how many, where."""

    names: tuple[str, ...]
    changed_bytes: int
    storage_bytes: int
    where: str  # the first change, relative to the first input's view

    def lines(self) -> list[str]:
        viewers = " and ".join(self.names)
        return [f"{self.changed_bytes} bytes of the buffer behind {viewers} ({self.storage_bytes} bytes) changed "
                f"outside {'its view' if len(self.names) == 1 else 'their views'}; the first {self.where}",
                "a kernel may write only the elements of the tensors it is given (the rest of the buffer is "
                "the caller's: the next KV-cache slot, the other rows of a strided view)"]


class Snapshot:
    """The byte copies of the storages a call's tensors view, and each tensor's pristine copy."""

    def __init__(self, named: list[tuple[str, Any]]) -> None:
        import torch

        self._groups: dict[tuple[str, int], _Group] = {}
        self._pristine: dict[int, Any] = {}
        for name, tensor in named:
            key = _storage_key(tensor)
            if key is not None:
                self._groups.setdefault(key, _Group(tensor.untyped_storage(), [])).views.append((name, tensor))
        for group in list(self._groups.values()):
            if len(group.views) == 1 and _whole_storage(group.views[0][1]):
                continue  # nothing outside the view: a plain clone below
            live = _bytes(group.storage, group.views[0][1].device)
            group.copy = torch.empty_like(live).copy_(live)
        for name, tensor in named:
            group = self._groups.get(_storage_key(tensor))
            if group is not None and group.copy is not None:
                self._pristine[id(tensor)] = _view(group.copy, tensor)
            elif id(tensor) not in self._pristine:
                self._pristine[id(tensor)] = tensor.detach().clone()

    def pristine(self, tensor: Any) -> Any:
        """The pristine copy of one of the call's tensors: its values before the call, in its own layout."""
        return self._pristine[id(tensor)]

    def written_outside(self) -> Outside | None:
        """The first storage whose bytes outside every view of it changed since the copy, or None."""
        import torch

        for group in self._groups.values():
            if group.copy is None:
                continue
            live = _bytes(group.storage, group.copy.device)
            if torch.equal(live, group.copy):
                continue
            differs = live != group.copy
            for _, tensor in group.views:  # a change inside a view is judged by value, elsewhere
                _view(differs, tensor).zero_()
            count = int(differs.sum())
            if count:
                first = int(differs.nonzero()[0, 0])
                return Outside(tuple(name for name, _ in group.views), count, differs.numel(),
                               _where(first, group.views[0]))
        return None


def pristine_bytes(tensors: list[Any]) -> int:
    """The bytes :class:`Snapshot` holds for these tensors (without allocating them): each shared or partly
    viewed storage once, whole, and every other tensor's own bytes."""
    storages: dict[tuple[str, int], list[Any]] = {}
    total = 0
    for tensor in tensors:
        key = _storage_key(tensor)
        if key is None:
            total += tensor.numel() * tensor.element_size()
        else:
            storages.setdefault(key, []).append(tensor)
    for views in storages.values():
        if len(views) == 1 and _whole_storage(views[0]):
            total += views[0].numel() * views[0].element_size()
        else:
            total += views[0].untyped_storage().nbytes()
    return total


@dataclass
class _Group:
    storage: Any
    views: list[tuple[str, Any]]
    copy: Any = None  # the storage's bytes before the call (uint8), where something lies outside the views


def _storage_key(tensor: Any) -> tuple[str, int] | None:
    """``(device, address)`` of the storage a plain strided tensor views; None for tensors whose memory the
    gate does not read byte for byte (sparse, conjugate or negative views, meta, empty)."""
    import torch

    try:
        if (tensor.layout != torch.strided or tensor.device.type == "meta" or tensor.is_conj() or tensor.is_neg()
                or type(tensor) is not torch.Tensor and not isinstance(tensor, torch.nn.Parameter)):
            return None
        storage = tensor.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return None
    if storage.nbytes() == 0 or tensor.numel() == 0:
        return None
    return str(tensor.device), storage.data_ptr()


def _whole_storage(tensor: Any) -> bool:
    """Whether ``tensor`` covers every byte of its storage exactly once (dense, at offset 0)."""
    if tensor.storage_offset() != 0 or tensor.numel() * tensor.element_size() != tensor.untyped_storage().nbytes():
        return False
    expected = 1
    for size, stride in sorted(((s, st) for s, st in zip(tensor.shape, tensor.stride()) if s != 1),
                               key=lambda pair: pair[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def _bytes(storage: Any, device: Any) -> Any:
    """A uint8 tensor over all of ``storage`` (no copy)."""
    import torch

    return torch.empty(0, dtype=torch.uint8, device=device).set_(storage)


def _view(buffer: Any, like: Any) -> Any:
    """``like``'s view (dtype, shape, strides, storage offset) of the bytes of ``buffer``."""
    import torch

    return torch.empty(0, dtype=like.dtype, device=buffer.device).set_(
        buffer.untyped_storage(), like.storage_offset(), like.shape, like.stride())


def _where(byte: int, view: tuple[str, Any]) -> str:
    """Where ``byte`` lies relative to a view: before its first element, past its last, or between."""
    name, tensor = view
    size = tensor.element_size()
    start = tensor.storage_offset() * size
    end = start + size * (1 + sum((n - 1) * abs(s) for n, s in zip(tensor.shape, tensor.stride())))
    if byte < start:
        return f"at byte {byte}, {start - byte} bytes before {name}'s first element"
    if byte >= end:
        return f"at byte {byte}, {byte - end} bytes past {name}'s last element"
    return f"at byte {byte}, between {name}'s elements (in a gap of its strides {tuple(tensor.stride())})"
