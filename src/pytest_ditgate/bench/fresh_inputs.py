"""Fresh inputs for a pair's timed calls: every timed call gets its own copy of each tensor argument.

A copy keeps the argument's layout (sizes, strides, storage offset modulo 64 bytes, so the same alignment and
the same vector paths) and, unless ``perturb`` is off, one element of each floating tensor is shrunk towards
zero by a random factor in [0.125, 0.5] (sign, zeros and bounds kept). So no timed call sees the objects,
the memory or the values an earlier call saw: a result cached by ``id()``, by pointer or by an ``is`` test
is stale, and the pair's output audit (:mod:`pytest_ditgate.bench.audit`) sees it. The copies are made from a
snapshot taken when the pair begins (never handed to the timed functions), which is also what the pair's
arguments are compared with afterwards (``input_mutated``).

Only tensors are copied: integers, modules and other arguments are passed as they are; a tensor this cannot
copy in place (sparse, quantized, a subclass) is cloned, and not perturbed.

Arguments the pair declares written (``out_args``, ``inout_args``, ``scratch_args``:
:mod:`pytest_ditgate.bench.declared`) may change in a timed call without being ``input_mutated``; the copies of
an out or scratch argument hold poison (``0xFF`` bytes, NaN in every floating format), as ``check_kernel``
fills them before a call, never the values of an earlier call: a function that leaves its out buffer unwritten
returns poison, whatever the pair's argument held. An in-out argument is copied (and perturbed) like any input:
every call starts from the values the pair began with.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from pytest_ditgate.correctness.structure import map_tensors, named_call_tensors
from pytest_ditgate.timer_integrity import watch

#: a changed element is multiplied by a factor drawn from this range: towards zero, never across it
FACTORS = (0.125, 0.5)
#: the copy starts at the argument's storage offset modulo this many bytes (its alignment class)
ALIGNMENT_BYTES = 64


@dataclass(frozen=True)
class Change:
    """Element ``position`` (in the copy's buffer) of tensor argument ``leaf`` multiplied by ``factor``."""

    leaf: int
    position: int
    factor: float


class _Kept:
    """One tensor argument as it was when the pair began, and how to copy it (``poisoned``: its copies hold
    poison, not its values)."""

    def __init__(self, name: str, tensor: Any, *, poisoned: bool = False) -> None:
        import torch

        self.name, self.source, self.poisoned = name, tensor, poisoned
        self.size, self.stride = tuple(tensor.shape), tuple(tensor.stride()) if tensor.layout == torch.strided else ()
        self.requires_grad = tensor.requires_grad
        self.parameter = isinstance(tensor, torch.nn.Parameter)
        self.in_place = (tensor.layout == torch.strided and type(tensor) in (torch.Tensor, torch.nn.Parameter)
                         and not tensor.is_conj() and not tensor.is_neg() and not tensor.is_quantized
                         and tensor.device.type != "meta")
        self.floating = tensor.is_floating_point() or tensor.is_complex()
        self.pinned = tensor.device.type == "cpu" and _pinned(tensor)
        with torch.no_grad():
            if self.in_place:
                self.span = 0 if tensor.numel() == 0 else 1 + sum((n - 1) * s for n, s in zip(self.size, self.stride))
                self.shift = tensor.storage_offset() % max(1, ALIGNMENT_BYTES // tensor.element_size())
                self.buffer = torch.empty(self.shift + self.span, dtype=tensor.dtype, device=tensor.device,
                                          pin_memory=self.pinned)
                if self.span and not poisoned:  # an out or scratch argument's copies never hold its values
                    source = torch.as_strided(tensor.detach(), (self.span,), (1,), tensor.storage_offset())
                    self.buffer[self.shift:].copy_(source)
            else:
                self.buffer = tensor.detach().clone()

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def view(self, buffer: Any) -> Any:
        return buffer.as_strided(self.size, self.stride, self.shift) if self.in_place else buffer

    @property
    def perturbed(self) -> bool:
        """Its copies differ in one element from the kept values."""
        return self.in_place and self.floating and bool(self.span) and not self.poisoned

    def change(self, leaf: int, rng: random.Random) -> Change | None:
        """A random element of the argument to change (None when this argument is not perturbed)."""
        if not self.perturbed:
            return None
        position = self.shift + sum(rng.randrange(n) * s for n, s in zip(self.size, self.stride))
        return Change(leaf, position, rng.uniform(*FACTORS))

    def copy(self, change: Change | None) -> Any:
        """A new tensor with the kept values (one of them changed) in the argument's layout."""
        import torch

        with torch.no_grad():
            if not self.in_place:
                copy = self.buffer.clone()
                if self.poisoned:
                    _poison(copy)
            else:
                buffer = torch.empty_like(self.buffer, pin_memory=self.pinned) if self.pinned else \
                    torch.empty_like(self.buffer)
                if self.poisoned:
                    _poison(buffer)
                else:
                    buffer.copy_(self.buffer)
                if change is not None:
                    try:
                        buffer[change.position].mul_(change.factor)
                    except (RuntimeError, TypeError):  # a dtype without arithmetic (float8): left as it is
                        pass
                copy = self.view(buffer)
        return self.dressed(copy)

    def dressed(self, copy: Any) -> Any:
        """``copy`` as the argument was: a parameter stays one, ``requires_grad`` is kept."""
        import torch

        if self.parameter:
            return torch.nn.Parameter(copy, requires_grad=self.requires_grad)
        return copy.requires_grad_(self.requires_grad) if self.requires_grad else copy

    def changed(self) -> bool:
        """The argument itself no longer holds the values it held when the pair began."""
        return not same_bits(self.source, self.view(self.buffer))


def _poison(tensor: Any) -> None:
    """Fill a copy with ``check_kernel``'s poison (bool tensors hold zeros: every pattern is a value there)."""
    import torch

    from pytest_ditgate.correctness.poison import fill_view

    if tensor.dtype is torch.bool:
        tensor.zero_()
    else:
        fill_view(tensor)


def layout_copy(tensor: Any) -> Any:
    """A new tensor holding ``tensor``'s values in its layout (sizes, strides, storage offset modulo
    :data:`ALIGNMENT_BYTES`), as a timed call's copies are made, but unperturbed: for a call on an argument a
    function writes, which must leave the argument itself as it is."""
    kept = _Kept("", tensor)
    return kept.dressed(kept.view(kept.buffer) if kept.in_place else kept.buffer)


def _pinned(tensor: Any) -> bool:
    try:
        return bool(tensor.is_pinned())
    except RuntimeError:  # no accelerator to pin for
        return False


class FreshInputs:
    """The pair's arguments kept as they were, and fresh copies of them for each timed call. ``writable``: names
    of the arguments the functions may write (declared out, in-out and scratch arguments: not compared after a
    call); ``poisoned``: those whose copies hold poison (out and scratch arguments)."""

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any], *, perturb: bool = True,
                 writable: frozenset[str] = frozenset(), poisoned: frozenset[str] = frozenset()) -> None:
        self.args, self.kwargs, self.perturb = args, kwargs, perturb
        self.writable = writable
        self.kept: list[_Kept] = []
        self._leaf_of: dict[int, int] = {}
        for name, tensor in named_call_tensors(args, kwargs):
            if id(tensor) not in self._leaf_of:  # one argument passed twice stays one tensor
                self._leaf_of[id(tensor)] = len(self.kept)
                self.kept.append(_Kept(name, tensor, poisoned=name in poisoned))

    @property
    def nbytes(self) -> int:
        """Bytes of one set of copies."""
        return sum(k.nbytes for k in self.kept)

    @property
    def varied(self) -> bool:
        """Each set of copies differs in value from the others (some floating argument is perturbed)."""
        return self.perturb and any(k.perturbed for k in self.kept)

    def draw(self, rng: random.Random) -> tuple[Change, ...]:
        """The changes of one new set of copies."""
        if not self.perturb:
            return ()
        found = (k.change(leaf, rng) for leaf, k in enumerate(self.kept))
        return tuple(c for c in found if c is not None)

    def make(self, changes: tuple[Change, ...] = ()) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``(args, kwargs)`` with every tensor a new copy of the kept one, ``changes`` applied."""
        by_leaf = {c.leaf: c for c in changes}
        copies = [k.copy(by_leaf.get(leaf)) for leaf, k in enumerate(self.kept)]

        def swap(tensor: Any) -> Any:
            return copies[self._leaf_of[id(tensor)]]

        return map_tensors(self.args, swap), map_tensors(self.kwargs, swap)

    def mutated(self) -> list[str]:
        """Names of the pair's tensor arguments, but the writable ones, whose values changed since the pair
        began."""
        return [k.name for k in self.kept if k.name not in self.writable and k.changed()]

    def written(self, args: tuple[Any, ...], kwargs: dict[str, Any], changes: tuple[Change, ...]) -> list[str]:
        """Names of the tensors of a timed call's copies (``args``, ``kwargs``, made with ``changes``), but the
        writable ones, that no longer hold what they were made with: the timed function wrote into arguments it
        was not declared to write."""
        expected_args, expected_kwargs = self.make(changes)
        given = named_call_tensors(args, kwargs)
        expected = named_call_tensors(expected_args, expected_kwargs)
        return [name for (name, now), (_, made) in zip(given, expected)
                if name not in self.writable and not same_bits(now, made)]


def _bits(tensor: Any) -> Any:
    """``tensor`` viewed as integers of its element size (NaN equals NaN with the same bits)."""
    import torch

    if tensor.is_complex():
        tensor = torch.view_as_real(tensor)
    if tensor.dtype == torch.bool:
        return tensor.view(torch.uint8)
    integer = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}.get(tensor.element_size())
    return tensor if integer is None or not tensor.is_floating_point() else tensor.view(integer)


def same_bits(a: Any, b: Any) -> bool:
    """``a`` and ``b`` have the same shape, dtype and bits (NaNs included)."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    try:
        return bool(torch.equal(_bits(a.detach()), _bits(b.detach()).to(a.device)))
    except RuntimeError:  # a layout the views above do not take (sparse, quantized): values
        return bool(torch.equal(a.detach(), b.detach()))


watch(__name__)
