"""Keyed commitments to timed outputs: a server binds itself to every output of a round before the judge says
which rounds it audits.

``commit(outputs, key)`` is a 64-bit value of the outputs' bytes under a key the judge draws for the round:
each 32-bit word ``w`` at position ``i`` of a tensor's bytes contributes ``((w ^ k1) * ((i * k2 + k3) mod P))
mod P``, summed exactly in int64 (no product or sum can overflow, so a CPU and a GPU give the same value); the
tensors, with their dtypes and shapes, are folded in order. Without the key a server cannot commit to outputs
it did not compute and later show others; with it, it must still show outputs that match the baseline's for
the judge's inputs.

Only plain tensors are accepted: a subclass, a meta tensor, or a tensor carrying attributes of its own (such as a
method replaced on the instance, ``t.double = f``, which could move work out of the timed call) is refused with
:class:`NotPlainOutput`.
"""

from __future__ import annotations

from typing import Any

MASK = (1 << 64) - 1
#: the modulus of each word's contribution (a Mersenne prime below 2^31)
P = (1 << 31) - 1


class NotPlainOutput(TypeError):
    """A timed output that is not a plain tensor (or a tuple, list or dict of them)."""


def splitmix64(state: int) -> tuple[int, int]:
    """One step of splitmix64: (next state, output)."""
    state = (state + 0x9E3779B97F4A7C15) & MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return state, z ^ (z >> 31)


def _constants(key: int, index: int) -> tuple[int, int, int]:
    state = (key ^ (index * 0xD1B54A32D192ED03)) & MASK
    state, a = splitmix64(state)
    state, b = splitmix64(state)
    _, c = splitmix64(state)
    return a & 0xFFFFFFFF, (b % (P - 1)) + 1, c % P


def flatten(outputs: Any, where: str = "output") -> list[tuple[str, Any]]:
    """(name, tensor) pairs of a call's outputs in a fixed order; NotPlainOutput for anything else."""
    import torch

    if isinstance(outputs, torch.Tensor):
        if type(outputs) is not torch.Tensor:
            raise NotPlainOutput(f"{where} is a {type(outputs).__name__}, a subclass of torch.Tensor: a timed "
                                 "output must be a plain tensor")
        if outputs.is_meta or outputs.is_sparse:
            raise NotPlainOutput(f"{where} is a {'meta' if outputs.is_meta else 'sparse'} tensor")
        if getattr(outputs, "__dict__", None):
            names = ", ".join(sorted(vars(outputs))[:4])
            raise NotPlainOutput(f"{where} carries attributes of its own ({names}): a timed output must be a "
                                 "plain tensor (a method replaced on it could move work out of the timed call)")
        return [(where, outputs)]
    if isinstance(outputs, (tuple, list)):
        return [pair for i, value in enumerate(outputs) for pair in flatten(value, f"{where}[{i}]")]
    if isinstance(outputs, dict):
        return [pair for name in sorted(outputs, key=str) for pair in flatten(outputs[name], f"{where}[{name!r}]")]
    raise NotPlainOutput(f"{where} is a {type(outputs).__name__}: a timed region returns tensors (or a tuple, "
                         "list or dict of them)")


def tensor_sum(tensor: Any, key: int, index: int) -> int:
    """The keyed sum of one tensor's bytes (exact int64 arithmetic on its device)."""
    import torch

    raw = tensor.detach().contiguous().reshape(-1)
    data = raw.view(torch.uint8) if raw.numel() else raw.new_empty(0, dtype=torch.uint8)
    pad = (-data.numel()) % 4
    if pad:
        data = torch.cat([data, data.new_zeros(pad)])
    if data.numel() == 0:
        return 0
    words = data.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    k1, k2, k3 = _constants(key, index)
    positions = torch.arange(words.numel(), device=words.device, dtype=torch.int64)
    multipliers = torch.remainder(positions * k2 + k3, P)
    contributions = torch.remainder(torch.bitwise_xor(words, k1) * multipliers, P)
    return int(contributions.sum().item())


def commit(outputs: Any, key: int) -> int:
    """The keyed 64-bit commitment of a call's outputs (their bytes, dtypes and shapes, in order)."""
    total = key & MASK
    for index, (name, tensor) in enumerate(flatten(outputs)):
        described = f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode()
        for byte in described:
            total = ((total ^ byte) * 0x100000001B3) & MASK
        total = (total * 0x9E3779B97F4A7C15 + tensor_sum(tensor, key, index)) & MASK
    return total


def commit_call(outputs: Any, key: int) -> int:
    """The commitment of one call's outputs as the judge recomputes it: their tensors in order, as a list (a
    server commits to what a call returned; the judge sees the tensors it dumped)."""
    return commit([tensor for _, tensor in flatten(outputs)], key)
