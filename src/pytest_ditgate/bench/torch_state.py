"""What a pair's two sides share in the process: torch's functions and its process-wide settings.

A candidate that replaces ``torch.Tensor.__matmul__`` (or ``torch.nn.functional.gelu``, ``torch.nn.Linear.forward``)
while the pair runs changes the reference's work, not only its own; one that calls ``torch.set_num_threads`` or
turns TF32 off changes the conditions the reference is timed under. :class:`TorchState` keeps the identities of
torch's callables (``torch``, ``torch.Tensor``, ``torch.nn.functional``, ``torch.linalg``, ``torch.fft``,
``torch.special`` and the ``torch.nn`` module classes) and the settings below when a pair begins, names what
changed since (``torch_tampered``), and puts it back. A replacement defined inside torch's own package (its
lazy wrappers, such as those ``torch.compile`` installs on first use) is torch's, not a change.

A setting changed and put back within one call (``torch.set_num_threads(2)`` for the candidate's own work only)
leaves nothing to compare: while the pair is timed, :meth:`TorchState.watch_setters` puts recorders in front
of torch's thread-count setters (:data:`THREAD_SETTERS`, in ``torch`` and ``torch._C``), and a call to one is a
change too. Code that bound a setter before the pair began (``from torch import set_num_threads``) is not seen.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from pytest_ditgate.timer_integrity import watch


def _flag(path: str, flag: str) -> tuple[str, Callable[[Any], Any], Callable[[Any, Any], None]]:
    """A boolean attribute of a torch backend object (``torch.backends.cudnn.benchmark``)."""
    def owner(torch: Any) -> Any:
        for part in path.split(".")[1:]:
            torch = getattr(torch, part)
        return torch

    return f"{path}.{flag}", lambda t: getattr(owner(t), flag), lambda t, v: setattr(owner(t), flag, v)


def _sdp(kind: str) -> tuple[str, Callable[[Any], Any], Callable[[Any, Any], None]]:
    """Whether an SDPA backend may be chosen (``torch.backends.cuda.flash_sdp_enabled()``)."""
    return (f"torch.backends.cuda.{kind}_sdp_enabled()", lambda t: getattr(t.backends.cuda, f"{kind}_sdp_enabled")(),
            lambda t, v: getattr(t.backends.cuda, f"enable_{kind}_sdp")(v))


#: process-wide settings a pair's sides share: (name as reported, getter, setter)
SETTINGS: tuple[tuple[str, Callable[[Any], Any], Callable[[Any, Any], None]], ...] = (
    ("torch.get_num_threads()", lambda t: t.get_num_threads(), lambda t, v: t.set_num_threads(v)),
    ("torch.get_num_interop_threads()", lambda t: t.get_num_interop_threads(), lambda t, v: None),
    ("torch.get_default_dtype()", lambda t: t.get_default_dtype(), lambda t, v: t.set_default_dtype(v)),
    ("torch.is_grad_enabled()", lambda t: t.is_grad_enabled(), lambda t, v: t.set_grad_enabled(v)),
    ("torch.get_float32_matmul_precision()", lambda t: t.get_float32_matmul_precision(),
     lambda t, v: t.set_float32_matmul_precision(v)),
    ("torch.are_deterministic_algorithms_enabled()", lambda t: t.are_deterministic_algorithms_enabled(),
     lambda t, v: t.use_deterministic_algorithms(v)),
    *(_flag("torch.backends.cuda.matmul", flag) for flag in
      ("allow_tf32", "allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction")),
    *(_flag("torch.backends.cudnn", flag) for flag in ("enabled", "benchmark", "deterministic", "allow_tf32")),
    _flag("torch.backends.mkldnn", "enabled"),
    *(_sdp(kind) for kind in ("flash", "mem_efficient", "math", "cudnn")),
)

_UNREADABLE = object()
#: torch's setters of the process's thread counts, recorded while a pair is timed
THREAD_SETTERS = ("set_num_threads", "set_num_interop_threads")


def _namespaces(torch: Any) -> list[tuple[str, Any]]:
    import torch.nn.functional as functional

    found = [("torch", torch), ("torch.Tensor", torch.Tensor), ("torch.nn.functional", functional),
             ("torch.linalg", torch.linalg), ("torch.fft", torch.fft), ("torch.special", torch.special)]
    found += [(f"torch.nn.{name}", value) for name, value in vars(torch.nn).items()
              if isinstance(value, type) and issubclass(value, torch.nn.Module)]
    return found


def _callables(namespace: Any) -> dict[str, Any]:
    return {name: value for name, value in vars(namespace).items()
            if callable(value) or isinstance(value, (staticmethod, classmethod, property))}


def _code_file(value: Any) -> str | None:
    for candidate in (value, getattr(value, "__func__", None), getattr(value, "fget", None)):
        code = getattr(candidate, "__code__", None)
        if code is not None:
            return os.path.abspath(code.co_filename)
    return None


def _read(torch: Any) -> dict[str, Any]:
    values = {}
    for name, getter, _ in SETTINGS:
        try:
            values[name] = getter(torch)
        except Exception:  # noqa: BLE001 - a backend this build lacks: nothing to compare
            values[name] = _UNREADABLE
    return values


class TorchState:
    """torch's callables and settings when the pair began: :meth:`changes` names what differs now,
    :meth:`restore` puts it back."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.root = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
        self.spaces = [(name, space, _callables(space)) for name, space in _namespaces(torch)]
        self.settings = _read(torch)
        #: (owner, name) -> (torch's setter, the recorder in front of it) while the setters are watched
        self.recorders: dict[tuple[Any, str], tuple[Any, Any]] = {}
        self.calls: list[str] = []

    def watch_setters(self) -> None:
        """Record every call of torch's thread-count setters from now until :meth:`unwatch_setters`."""
        for owner in (self.torch, self.torch._C):
            for name in THREAD_SETTERS:
                setter = vars(owner).get(name)
                if setter is None or (owner, name) in self.recorders:
                    continue

                def recorder(*args: Any, _name: str = name, _setter: Any = setter, **kwargs: Any) -> Any:
                    self.calls.append(f"torch.{_name}({', '.join(repr(a) for a in args)}) called")
                    return _setter(*args, **kwargs)

                setattr(owner, name, recorder)
                self.recorders[(owner, name)] = (setter, recorder)

    def unwatch_setters(self) -> None:
        """Put torch's own setters back (where the recorder is still in place)."""
        for (owner, name), (setter, recorder) in self.recorders.items():
            if vars(owner).get(name) is recorder:
                setattr(owner, name, setter)
        self.recorders = {}

    def _torch_own(self, value: Any) -> bool:
        where = _code_file(value)
        return where is not None and where.startswith(self.root)

    def replaced(self) -> list[tuple[str, Any, str, Any]]:
        """(dotted name, namespace, attribute, value when the pair began or None when added) of each callable
        replaced, removed or added (an added one shadows a base class's) since the pair began."""
        found = []
        ours = {id(recorder) for _, recorder in self.recorders.values()}
        for label, space, before in self.spaces:
            now = vars(space)
            for name, value in before.items():
                current = now.get(name)
                if current is not value and id(current) not in ours and not (current is not None
                                                                               and self._torch_own(current)):
                    found.append((f"{label}.{name}", space, name, value))
            if isinstance(space, type):
                for name, current in list(now.items()):
                    if (name not in before and callable(current) and not self._torch_own(current)
                            and any(name in vars(base) for base in space.__mro__[1:])):
                        found.append((f"{label}.{name}", space, name, None))
        return found

    def changed_settings(self) -> list[tuple[str, Any, Any]]:
        """(name, value when the pair began, value now) of each setting that changed."""
        now = _read(self.torch)
        return [(name, self.settings[name], now[name]) for name, _, _ in SETTINGS
                if self.settings[name] is not _UNREADABLE and now[name] != self.settings[name]]

    def changes(self) -> list[str]:
        """One phrase per change since the pair began (empty when none)."""
        return ([f"{name} {'replaced' if attribute in vars(space) else 'removed'}"
                 for name, space, attribute, _ in self.replaced()]
                + [f"{name} {before!r} -> {now!r}" for name, before, now in self.changed_settings()]
                + list(dict.fromkeys(self.calls)))

    def restore(self) -> None:
        """Put back every callable and setting that changed."""
        for _, space, name, value in self.replaced():
            try:
                if value is None:
                    delattr(space, name)
                else:
                    setattr(space, name, value)
            except (AttributeError, TypeError):
                continue
        setters = {name: setter for name, _, setter in SETTINGS}
        for name, before, _ in self.changed_settings():
            try:
                setters[name](self.torch, before)
            except Exception:  # noqa: BLE001 - a setting torch will not take back: it was reported
                continue
        self.calls = []


watch(__name__)
