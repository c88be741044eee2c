"""What a kernel does with each argument: reads it (the default), writes it (``out_args``), reads and writes
it (``inout_args``), or uses it as scratch it may overwrite (``scratch_args``).

A kernel that updates a buffer in place (a KV-cache append, an ``_inplace`` RoPE, a fused optimizer step, a
cross entropy that writes its gradient into the logits) is checked by declaring that argument: an in-out
argument is compared after the call with the reference's version of it (the reference gets its own copy,
which it updates the same way); scratch holds unspecified contents on entry (the gate poisons it before
every call) and is not compared. Any other argument the kernel changes still fails ``input_mutated``, and so
does a write outside an argument's view (:mod:`pytest_ditgate.correctness.storage`). Keys are positional indices or keyword names, as
``make_inputs`` passes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from pytest_ditgate.arguments import describe
from pytest_ditgate.errors import DitgateUsageError

ROLES = ("out_args", "inout_args", "scratch_args")


def parse_keys(value: Any, name: str, call: str) -> tuple[int | str, ...]:
    """Argument keys (positional indices and keyword names), or a usage error naming ``name``."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or not all(
            isinstance(key, str) or (isinstance(key, int) and not isinstance(key, bool)) for key in value):
        raise DitgateUsageError(f"{call}: {name} must be a tuple of positional indices and keyword names "
                                f"(like (2,) or ('out',)), got {describe(value)}")
    return tuple(value)


def key_name(key: int | str) -> str:
    """The name a call's tensor argument has in messages (``arg2``, ``cache``)."""
    return f"arg{key}" if isinstance(key, int) else key


@dataclass(frozen=True)
class Roles:
    """The declared roles of a call's arguments (every undeclared argument is read-only)."""

    out: tuple[int | str, ...] = ()
    inout: tuple[int | str, ...] = ()
    scratch: tuple[int | str, ...] = ()

    @classmethod
    def parse(cls, call: str, *, out_args: Any = (), inout_args: Any = (), scratch_args: Any = ()) -> "Roles":
        """Validated roles; an argument named in two roles is a usage error."""
        roles = cls(parse_keys(out_args, "out_args", call), parse_keys(inout_args, "inout_args", call),
                    parse_keys(scratch_args, "scratch_args", call))
        seen: dict[str, str] = {}
        for role, keys in zip(ROLES, (roles.out, roles.inout, roles.scratch)):
            for key in keys:
                name = key_name(key)
                if name in seen:
                    raise DitgateUsageError(f"{call}: argument {key!r} is named in both {seen[name]} and {role}: "
                                            "an argument is written (out_args), read and written (inout_args) or "
                                            "scratch (scratch_args), not two of them")
                seen[name] = role
        return roles

    @property
    def writable(self) -> frozenset[str]:
        """Names of the arguments the kernel may change (not checked for ``input_mutated``)."""
        return frozenset(key_name(key) for key in self.out + self.inout + self.scratch)

    def tensors(self, args: Sequence[Any], kwargs: dict[str, Any], role: str) -> list[tuple[str, Any]]:
        """``(name, tensor)`` of each argument declared in ``role`` (``out_args``...), as passed in this call."""
        import torch

        keys = {"out_args": self.out, "inout_args": self.inout, "scratch_args": self.scratch}[role]
        found = []
        for key in keys:
            try:
                value = args[key] if isinstance(key, int) else kwargs[key]
            except (IndexError, KeyError):
                raise DitgateUsageError(f"{role} names {key!r}, which make_inputs did not provide") from None
            if not isinstance(value, torch.Tensor):
                raise DitgateUsageError(f"{role} {key!r} is not a tensor ({type(value).__name__})")
            found.append((key_name(key), value))
        return found


def copy_like(tensor: Any, values: Any = None) -> Any:
    """A new tensor with ``tensor``'s shape, strides, storage offset, dtype and device, holding ``values``
    (default: ``tensor``'s own): a kernel that reads memory through its strides sees the layout
    ``make_inputs`` built. Overlapping views (stride 0) get a plain copy."""
    import torch

    source = tensor if values is None else values
    overlapping = any(stride == 0 and size > 1 for size, stride in zip(tensor.shape, tensor.stride()))
    if overlapping or tensor.numel() == 0:
        return source.detach().to(tensor.dtype).clone()
    span = tensor.storage_offset() + 1 + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
    base = torch.empty(span, dtype=tensor.dtype, device=tensor.device)
    out = base.as_strided(tensor.shape, tensor.stride(), tensor.storage_offset())
    out.copy_(source.detach())
    return out
