"""The arguments of the public entry points, checked before any work, and values named in messages by type and
shape, never printed whole. Torch-free.

Every public entry point (``check_kernel``/``kernel_check``, ``measure``/``ditbench``, ``golden.check``,
``quality_gate.check``) checks its arguments with these helpers first: a usage error is a
:class:`~pytest_ditgate.errors.DitgateUsageError` naming the argument, raised before any timing or checking.
An exception raised inside the user's own code (a kernel, a reference, ``make_inputs``, a timed function) is
marked with :func:`raised_by`; the report then shows that code's traceback without the plugin's frames
(``reporting.py``).
"""

from __future__ import annotations

import math
from typing import Any

from pytest_ditgate.errors import DitgateUsageError

#: no value shown in a message is longer than this (a 1M-element list is named by its type and length)
LIMIT = 200
#: attribute set on an exception raised by the user's code: who raised it (read by ``reporting.py``)
RAISED_BY = "_ditgate_raised_by"


def clip(text: Any, limit: int = LIMIT) -> str:
    """``text`` cut to ``limit`` characters, saying how long it was."""
    text = str(text)
    if len(text) <= limit:
        return text
    return text[: max(limit - 30, 10)] + f"... ({len(text)} characters)"


def type_name(value: Any) -> str:
    """``list``, ``torch.Tensor``, ``numpy.ndarray``: the builtin name, else package.class."""
    kind = type(value)
    module = kind.__module__ or ""
    if module == "builtins":
        return kind.__qualname__
    return f"{module.split('.')[0]}.{kind.__qualname__}"


def describe(value: Any) -> str:
    """What ``value`` is, by type and shape, in at most :data:`LIMIT` characters: ``torch.Tensor
    float32[8, 16] on cpu``, ``list of 8 x list of 16 x float``, ``numpy.ndarray float64[3]``,
    ``dict {'a': ..., 'b': ...}``; numbers and short strings with their value."""
    return clip(_describe(value, 0))


def _describe(value: Any, depth: int) -> str:
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is not None and dtype is not None and not isinstance(value, type):
        dims = list(shape) if isinstance(shape, tuple) or hasattr(shape, "__iter__") else shape
        device = getattr(value, "device", None)
        where = f" on {device}" if device is not None and type_name(value).startswith("torch.") else ""
        return f"{type_name(value)} {str(dtype).removeprefix('torch.')}{dims}{where}"
    if value is None:
        return "None"
    if isinstance(value, (bool, int, float, complex, str, bytes)):  # inside a container: the type alone
        return f"{type_name(value)} {clip(repr(value), 60)}" if depth == 0 else type_name(value)
    if isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)
        kind = type_name(value)
        if not items:
            return f"empty {kind}"
        if depth >= 3:
            return f"{kind} of {len(items)}"
        parts = [_describe(item, depth + 1) for item in items[:64]]
        if len(set(parts)) == 1 and (len(items) <= 64 or len(parts) == 64):
            return f"{kind} of {len(items)} x {parts[0]}"
        shown = ", ".join(parts[:4]) + (", ..." if len(items) > 4 else "")
        return f"{kind} of {len(items)} ({shown})"
    if isinstance(value, dict):
        if not value:
            return f"empty {type_name(value)}"
        if depth >= 3:
            return f"{type_name(value)} of {len(value)}"
        shown = ", ".join(f"{clip(repr(key), 40)}: {_describe(item, depth + 1)}"
                          for key, item in list(value.items())[:4])
        return f"{type_name(value)} {{{shown}{', ...' if len(value) > 4 else ''}}}"
    if callable(value):
        name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
        return f"{type_name(value)} {name}" if name else type_name(value)
    return type_name(value)


def closest(name: str, choices: Any) -> str | None:
    """The one of ``choices`` that ``name`` is a likely typo of, or None."""
    import difflib

    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.6)
    return close[0] if close else None


def did_you_mean(name: str, choices: Any, *, prefix: str = "") -> str:
    """``"; did you mean 'fixed_paths'?"`` when ``name`` is close to one of ``choices`` (a typo), else ``""``: the
    tail every message about an unknown key, option or name gives (``prefix`` goes before the suggestion)."""
    close = closest(name, choices)
    return f"; did you mean {prefix + close!r}?" if close else ""


def is_torch_tensor(value: Any) -> bool:
    """Whether ``value`` is a torch tensor (or subclass), without importing torch (no torch: it cannot be)."""
    import sys

    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def callable_name(fn: Any) -> str:
    """The name a message gives a user's callable: ``fused_rmsnorm``, ``Model.forward``, ``<lambda>``,
    ``torch.log`` (a builtin by its module, not its hidden class)."""
    import inspect

    if inspect.isbuiltin(fn) and isinstance(getattr(fn, "__name__", None), str):
        module = getattr(fn, "__module__", None)
        return fn.__name__ if module in (None, "builtins") else f"{module}.{fn.__name__}"
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


def require_callable(value: Any, argument: str, call: str, what: str) -> None:
    """DitgateUsageError unless ``value`` is callable: ``<call>: <argument> must be a callable (<what>), got ...``."""
    if not callable(value):
        raise DitgateUsageError(f"{call}: {argument} must be a callable ({what}), got {describe(value)}")


def positional_arity_error(fn: Any, count: int) -> str | None:
    """Why ``fn`` cannot be called with ``count`` positional arguments (None when it can, or when its
    signature cannot be read: builtins and C extensions are given the benefit of the doubt)."""
    import inspect

    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*range(count))
    except TypeError as exc:
        return f"{callable_name(fn)}{signature} cannot be called with {count} argument(s) ({exc})"
    return None


def require_int(value: Any, argument: str, call: str, *, minimum: int | None = None) -> int:
    """``value`` when it is an int (not a bool) >= ``minimum``; DitgateUsageError naming ``argument`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        bound = "" if minimum is None else f" >= {minimum}"
        raise DitgateUsageError(f"{call}: {argument} must be an integer{bound}, got {describe(value)}")
    return value


def require_number(value: Any, argument: str, call: str, *, minimum: float | None = None,
                   exclusive: bool = False, hint: str = "") -> float:
    """``value`` as a float when it is a finite int/float (not a bool) >= ``minimum`` (> with ``exclusive``);
    DitgateUsageError naming ``argument`` otherwise."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and minimum is not None:
        ok = value > minimum if exclusive else value >= minimum
    if not ok:
        what = "a finite number" if minimum is None else f"{'>' if exclusive else '>='} {minimum:g} (a finite number)"
        raise DitgateUsageError(f"{call}: {argument} must be {what}, got {describe(value)}{hint}")
    return float(value)


def raised_by(exc: BaseException, who: str) -> BaseException:
    """Mark ``exc`` as raised by the user's code ``who`` (``"the reference `ref` (trial 1, seed 0)"``): a note
    on the exception says so (Python 3.11+), and the report shows that code's frames, not the plugin's."""
    try:
        setattr(exc, RAISED_BY, who)
    except (AttributeError, TypeError):  # an exception type that refuses attributes: left unmarked
        return exc
    note = f"ditgate: raised by {who}"
    if hasattr(exc, "add_note") and note not in getattr(exc, "__notes__", ()):
        exc.add_note(note)
    return exc


def user_code_of(exc: BaseException) -> str | None:
    """Who raised ``exc`` when :func:`raised_by` marked it, else None."""
    return getattr(exc, RAISED_BY, None)
