"""Timer integrity: has anyone replaced or wrapped the functions a gate times with?

An agent that patches ``time.perf_counter`` or ``torch.cuda.Event.elapsed_time`` can make any kernel look
fast, and one that patches ``torch.cuda.synchronize`` can hide unfinished work. :func:`tampered_timers`
names every such function that is not the one its own module defines. Standard library only: torch is
inspected only when something else has already imported it (this module never imports it).
"""

from __future__ import annotations

import os
import sys
import time
import types
from typing import Any, Callable

_CLOCKS = ("perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time")


def _is_time_builtin(name: str, function: Any) -> bool:
    return (isinstance(function, types.BuiltinFunctionType) and getattr(function, "__self__", None) is time
            and function.__name__ == name)


#: the stdlib clocks seen at first import, kept only if they were genuine then (a module first imported
#: while a test had patched a clock must not take the patch for the original)
_STDLIB_ORIGINALS: dict[str, Any] = {
    name: getattr(time, name) for name in _CLOCKS if _is_time_builtin(name, getattr(time, name))
}

#: torch functions a gate relies on: (dotted name for the report, getter, defining file relative to torch)
_TORCH_FUNCTIONS: tuple[tuple[str, Callable[[Any], Any], str], ...] = (
    ("torch.cuda.synchronize", lambda t: t.cuda.synchronize, "cuda/__init__.py"),
    ("torch.cuda.Event.elapsed_time", lambda t: t.cuda.Event.__dict__.get("elapsed_time"), "cuda/streams.py"),
    ("torch.cuda.Event.record", lambda t: t.cuda.Event.__dict__.get("record"), "cuda/streams.py"),
    ("torch.cuda.Event.synchronize", lambda t: t.cuda.Event.__dict__.get("synchronize"), "cuda/streams.py"),
    ("torch.cuda.Event.query", lambda t: t.cuda.Event.__dict__.get("query"), "cuda/streams.py"),
    ("torch.cuda.Stream.synchronize", lambda t: t.cuda.Stream.__dict__.get("synchronize"), "cuda/streams.py"),
)


def tampered_timers() -> list[str]:
    """Names of timing functions that were replaced or wrapped (empty when all are genuine)."""
    found = [f"time.{name}" for name in _CLOCKS if not _genuine_clock(name, _STDLIB_ORIGINALS.get(name))]
    timeit = sys.modules.get("timeit")
    if timeit is not None and not _genuine_clock("perf_counter", None, getattr(timeit, "default_timer", None)):
        found.append("timeit.default_timer")
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "cuda"):
        found.extend(_tampered_torch(torch))
    return found


def _genuine_clock(name: str, original: Any, current: Any = None) -> bool:
    """A stdlib clock is genuine when it is the ``time`` module's own builtin (and the one seen at import)."""
    current = getattr(time, name) if current is None else current
    if original is not None and current is not original:
        return False
    return _is_time_builtin(name, current)


def _tampered_torch(torch: Any) -> list[str]:
    root = os.path.dirname(os.path.abspath(torch.__file__))
    found = []
    event, stream = getattr(torch.cuda, "Event", None), getattr(torch.cuda, "Stream", None)
    if not _is_torch_class(event, "torch.cuda.streams", "Event"):
        found.append("torch.cuda.Event")
    if not _is_torch_class(stream, "torch.cuda.streams", "Stream"):
        found.append("torch.cuda.Stream")
    for dotted, getter, relpath in _TORCH_FUNCTIONS:
        try:
            function = getter(torch)
        except AttributeError:
            function = None
        if not _is_torch_function(function, dotted.rsplit(".", 1)[-1], os.path.join(root, relpath)):
            found.append(dotted)
    return found


def _is_torch_class(cls: Any, module: str, name: str) -> bool:
    return isinstance(cls, type) and cls.__module__ == module and cls.__qualname__ == name


def _is_torch_function(function: Any, name: str, path: str) -> bool:
    """True when ``function`` is the plain Python function torch defines in ``path`` (no wrapper)."""
    if not isinstance(function, types.FunctionType) or hasattr(function, "__wrapped__"):
        return False
    code = function.__code__
    return (
        function.__name__ == name
        and code.co_name == name
        and os.path.abspath(code.co_filename) == path
        and (function.__module__ or "").startswith("torch.cuda")
    )
