"""Walking the nested arguments and outputs of a kernel: tensors inside tuples, lists and dicts.

Inputs from ``make_inputs(seed)`` and outputs of a kernel may be one tensor or any nesting of
tuples/lists/dicts of tensors; these helpers give every tensor a readable name (``out[1]``,
``out['lse']``) and rebuild a structure with each tensor transformed.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator


def is_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def as_call(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``make_inputs`` result -> ``(args, kwargs)``: a tuple/list is positional, a dict is keyword,
    a pair ``(tuple, dict)`` is both, anything else is the single positional argument."""
    if (isinstance(inputs, tuple) and len(inputs) == 2 and isinstance(inputs[0], (tuple, list))
            and isinstance(inputs[1], dict)):
        return tuple(inputs[0]), dict(inputs[1])
    if isinstance(inputs, dict):
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    return (inputs,), {}


def named_leaves(value: Any, name: str) -> Iterator[tuple[str, Any]]:
    """Every leaf of ``value`` (a tensor or any other non-container) with a path-like name."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from named_leaves(item, f"{name}[{key!r}]")
    elif isinstance(value, (tuple, list)):
        for index, item in enumerate(value):
            yield from named_leaves(item, f"{name}[{index}]")
    else:
        yield name, value


def named_tensors(value: Any, name: str) -> Iterator[tuple[str, Any]]:
    """Every tensor in ``value`` with a path-like name (non-tensor leaves are skipped)."""
    return ((leaf_name, leaf) for leaf_name, leaf in named_leaves(value, name) if is_tensor(leaf))


def named_call_tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, Any]]:
    """Every tensor argument of a call: ``arg0``, ``arg1[2]``, ``scale``..."""
    found = []
    for index, arg in enumerate(args):
        found.extend(named_tensors(arg, f"arg{index}"))
    for key, arg in kwargs.items():
        found.extend(named_tensors(arg, key))
    return found


def map_tensors(value: Any, fn: Callable[[Any], Any]) -> Any:
    """``value`` rebuilt with ``fn`` applied to each tensor (other leaves kept as they are)."""
    if is_tensor(value):
        return fn(value)
    if isinstance(value, dict):
        return type(value)((key, map_tensors(item, fn)) for key, item in value.items())
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(map_tensors(item, fn) for item in value))
    if isinstance(value, (tuple, list)):
        return type(value)(map_tensors(item, fn) for item in value)
    return value


def structure_of(value: Any) -> Any:
    """The nesting of ``value`` with tensors replaced by ``"T"`` (to compare output structures)."""
    if is_tensor(value):
        return "T"
    if isinstance(value, dict):
        return {key: structure_of(item) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        return [structure_of(item) for item in value]
    return type(value).__name__
