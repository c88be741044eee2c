"""Timer integrity: has anyone replaced or wrapped the functions a gate times with?

An agent that patches ``time.perf_counter`` or ``torch.cuda.Event.elapsed_time`` can make any kernel look
fast, and one that patches ``torch.cuda.synchronize`` can hide unfinished work. :func:`tampered_timers`
names every such function that is not the one its own module defines. Standard library only: torch is
inspected only when something else has already imported it (this module never imports it).

A timing module binds the genuine clocks when it loads (:func:`bind_clock`: a clock patched later does not
reach it, and a replaced binding is reported like a replaced clock) and registers its own names (:func:`watch`):
:func:`changed_bindings` names every name of a watched module rebound, added or removed while the timed code ran
(a fake clock module, a sampler replaced, a function whose code was swapped), and :func:`restore_timers` puts
them back.
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


def bind_clock(module_name: str, attribute: str, clock: str = "perf_counter") -> Callable[[], float]:
    """The stdlib clock ``clock`` as it was when this module first loaded (if it was genuine then, else the
    current one), for ``module_name`` to bind as ``attribute`` when it loads; :func:`tampered_timers` then
    also reports that binding if it is ever replaced."""
    _BOUND_CLOCKS.append((vars(sys.modules[module_name]), f"{module_name}.{attribute}", attribute, clock))
    return _STDLIB_ORIGINALS.get(clock) or getattr(time, clock)


#: (module namespace, dotted name, attribute, clock name) of each clock a timing module bound at load
_BOUND_CLOCKS: list[tuple[dict[str, Any], str, str, str]] = []
#: module name -> the namespace its functions run in, for every module that times or judges a timing
_WATCHED: dict[str, dict[str, Any]] = {}
_MISSING = object()


def watch(module_name: str) -> None:
    """Register ``module_name`` (already in ``sys.modules``): :func:`bindings` includes its names."""
    _WATCHED[module_name] = vars(sys.modules[module_name])


def bindings() -> dict[str, dict[str, tuple[Any, Any]]]:
    """module name -> {name: (value, the code of a function value)} for every watched module: taken before
    timing, compared after it by :func:`changed_bindings`."""
    return {module_name: {name: (value, getattr(value, "__code__", None)) for name, value in list(namespace.items())
                          if not name.startswith("__")}
            for module_name, namespace in list(_WATCHED.items())}


def changed_bindings(before: dict[str, dict[str, tuple[Any, Any]]]) -> list[str]:
    """``module.name`` for every name of a module watched ``before`` that was rebound, removed or added since (an
    added name shadows a builtin for the module's functions; a function whose code was swapped counts too)."""
    now = bindings()
    found = []
    for module_name, names in before.items():
        current = now.get(module_name, {})
        found += [f"{module_name}.{name}" for name, (value, code) in names.items()
                  if name not in current or current[name][0] is not value or current[name][1] is not code]
        found += [f"{module_name}.{name}" for name in current if name not in names]
    return found


def restore_timers(before: dict[str, dict[str, tuple[Any, Any]]] | None = None) -> None:
    """Put back the stdlib clocks seen at first import, every clock a timing module bound, and (given the
    :func:`bindings` taken before timing) every name of a watched module changed since."""
    for name, original in _STDLIB_ORIGINALS.items():
        setattr(time, name, original)
    for namespace, _, attribute, clock in _BOUND_CLOCKS:
        if clock in _STDLIB_ORIGINALS:
            namespace[attribute] = _STDLIB_ORIGINALS[clock]
    if before is None:
        return
    for dotted in changed_bindings(before):
        module_name, _, name = dotted.rpartition(".")
        namespace, names = _WATCHED[module_name], before[module_name]
        if name not in names:
            namespace.pop(name, None)
            continue
        value, code = names[name]
        namespace[name] = value
        if code is not None:
            value.__code__ = code


def tampered_timers() -> list[str]:
    """Names of timing functions that were replaced or wrapped (empty when all are genuine)."""
    found = [f"time.{name}" for name in _CLOCKS if not _genuine_clock(name, _STDLIB_ORIGINALS.get(name))]
    timeit = sys.modules.get("timeit")
    if timeit is not None and not _genuine_clock("perf_counter", None, getattr(timeit, "default_timer", None)):
        found.append("timeit.default_timer")
    found.extend(dotted for namespace, dotted, attribute, clock in _BOUND_CLOCKS
                 if not _genuine_clock(clock, _STDLIB_ORIGINALS.get(clock), namespace.get(attribute)))
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


watch(__name__)
