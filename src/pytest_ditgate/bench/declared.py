"""The arguments a pair's functions write: ``out_args``, ``inout_args`` and ``scratch_args``.

An output-buffer kernel (``gelu(x, out)``) or an in-place one (a KV-cache append) returns nothing: what it
computed is in an argument. ``ditbench.pair`` and ``measure_pair`` take the declarations of ``check_kernel``,
parsed by the same code (:class:`pytest_ditgate.correctness.roles.Roles`) and meaning the same: an out argument
is written only, an in-out argument read and updated in place, a scratch argument a workspace whose contents on
entry and exit mean nothing. The functions never see them. What the pair does with them:

- the agreement check (:mod:`pytest_ditgate.bench.agreement`) hands them to ``check_kernel``, which compares the
  out and in-out arguments after the call with the reference's;
- every timed call gets its own copies (:mod:`pytest_ditgate.bench.fresh_inputs`): an in-out argument's hold the
  values the pair began with, an out or scratch argument's hold poison; their writes are no ``input_mutated``,
  a write into any other argument still is;
- an audited call's out and in-out arguments are copied as it returns (its :class:`Result`) and judged after
  timing against the reference on that call's own inputs (:func:`replay`); scratch is not judged.

The pair's own arguments are never written: the agreement check, the traces, the profiles and the timed calls
run on copies of the declared arguments (:meth:`Declared.copies`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from pytest_ditgate.correctness.roles import ROLES, Roles, key_name
from pytest_ditgate.correctness.structure import is_tensor, map_tensors, named_call_tensors, named_tensors
from pytest_ditgate.errors import DitgateUsageError

#: what each role is called beside an argument's name in messages (``out arg1``, ``in-out cache``)
LABELS = {"out_args": "out", "inout_args": "in-out", "scratch_args": "scratch"}


@dataclass(frozen=True)
class Declared:
    """The roles a pair declares for its arguments (every other argument is read-only)."""

    roles: Roles = field(default_factory=Roles)

    @classmethod
    def parse(cls, call: str, *, out_args: Any = (), inout_args: Any = (), scratch_args: Any = ()) -> "Declared":
        """Validated as ``check_kernel`` validates them (positions and keyword names; one role an argument)."""
        return cls(Roles.parse(call, out_args=out_args, inout_args=inout_args, scratch_args=scratch_args))

    def __bool__(self) -> bool:
        return bool(self.roles.writable)

    def keys(self, role: str) -> tuple[int | str, ...]:
        return {"out_args": self.roles.out, "inout_args": self.roles.inout, "scratch_args": self.roles.scratch}[role]

    @property
    def writable(self) -> frozenset[str]:
        """Names of the arguments the functions may write (their writes are no ``input_mutated``)."""
        return self.roles.writable

    @property
    def poisoned(self) -> frozenset[str]:
        """Names of the arguments whose contents on entry mean nothing (out and scratch): copies hold poison."""
        return frozenset(key_name(key) for key in self.roles.out + self.roles.scratch)

    @property
    def compared(self) -> bool:
        """Some argument is an output (out or in-out): compared after the call."""
        return bool(self.roles.out or self.roles.inout)

    def options(self) -> dict[str, tuple[int | str, ...]]:
        """The declarations as ``check_kernel``'s keywords."""
        return {role: self.keys(role) for role in ROLES}

    def describe(self) -> str:
        """The declarations as written: ``out_args=(1,), inout_args=('cache',)`` (empty when there are none)."""
        return ", ".join(f"{role}={self.keys(role)!r}" for role in ROLES if self.keys(role))

    def check(self, args: tuple[Any, ...], kwargs: dict[str, Any], call: str) -> None:
        """A usage error, before anything runs, for a declaration that names no tensor argument of the call, or
        a declared tensor passed as another argument too (a function would read it while it writes it)."""
        everything = named_call_tensors(args, kwargs)
        for role in ROLES:
            for key in self.keys(role):
                if isinstance(key, int) and not 0 <= key < len(args):
                    raise DitgateUsageError(f"{call}: {role} names position {key}, but the pair has {len(args)} "
                                            "positional argument(s) after the two functions (counted from 0)")
                if isinstance(key, str) and key not in kwargs:
                    known = ", ".join(map(repr, kwargs)) or "none"
                    raise DitgateUsageError(f"{call}: {role} names {key!r}, which is none of the pair's keyword "
                                            f"arguments ({known})")
                value = args[key] if isinstance(key, int) else kwargs[key]
                if not is_tensor(value):
                    raise DitgateUsageError(f"{call}: {role} names {key_name(key)}, which is not a tensor "
                                            f"({type(value).__name__}): only a tensor argument can be written")
                again = [name for name, tensor in everything if tensor is value and name != key_name(key)]
                if again:
                    raise DitgateUsageError(f"{call}: {key_name(key)} ({role}) is the same tensor as "
                                            f"{', '.join(again)}: pass a tensor a function writes once")

    def tensors(self, args: tuple[Any, ...], kwargs: dict[str, Any],
                roles: tuple[str, ...] = ROLES) -> list[tuple[str, Any]]:
        """``(name, tensor)`` of each argument declared in ``roles``, as passed in this call."""
        return [(key_name(key), args[key] if isinstance(key, int) else kwargs[key])
                for role in roles for key in self.keys(role)]

    def copies(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``(args, kwargs)`` with each declared argument replaced by a copy in its layout (the others as they
        are): a call on them leaves the pair's own arguments as they were."""
        if not self:
            return args, kwargs
        from pytest_ditgate.bench.fresh_inputs import layout_copy

        args, kwargs = list(args), dict(kwargs)
        for role in ROLES:
            for key in self.keys(role):
                if isinstance(key, int):
                    args[key] = layout_copy(args[key])
                else:
                    kwargs[key] = layout_copy(kwargs[key])
        return tuple(args), kwargs

    def result(self, returned: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> "Result":
        """What a call on ``args``/``kwargs`` produced: what it returned, and its out and in-out arguments."""
        return Result(returned, dict(self.tensors(args, kwargs, ("out_args", "inout_args"))),
                      {key_name(key): LABELS["out_args"] for key in self.roles.out}
                      | {key_name(key): LABELS["inout_args"] for key in self.roles.inout})


@dataclass
class Result:
    """What one call produced: its return value and its declared out and in-out arguments after it (by name;
    ``labels`` says which is which)."""

    returned: Any
    written: dict[str, Any] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)

    def named(self) -> list[tuple[str, Any]]:
        """Every tensor: ``output``, ``output[1]``... for the return value, ``out arg1``, ``in-out cache``."""
        return list(named_tensors(self.returned, "output")) + [
            (f"{self.labels.get(name, 'argument')} {name}", tensor) for name, tensor in self.written.items()]

    def copy(self) -> "Result":
        """Copies of every tensor, detached (what the call produced, whatever happens to its tensors later)."""
        def clone(tensor: Any) -> Any:
            return tensor.detach().clone()

        return Result(map_tensors(self.returned, clone), {name: clone(t) for name, t in self.written.items()},
                      dict(self.labels))


def replay(declared: Declared, result: Result) -> Callable[..., Any]:
    """A function that produces ``result`` again when called on a call's arguments: writes the recorded out and
    in-out arguments into that call's and returns the recorded return value. ``check_kernel`` judges it as the
    candidate it stands for (an audited timed call) against the reference on those arguments."""
    def replayed(*args: Any, **kwargs: Any) -> Any:
        for name, tensor in declared.tensors(args, kwargs, ("out_args", "inout_args")):
            tensor.detach().copy_(result.written[name])
        return result.returned

    replayed.__name__ = replayed.__qualname__ = "recorded_output"
    return replayed
