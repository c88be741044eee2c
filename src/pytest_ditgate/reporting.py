"""How a gate's failure reads in pytest's report, for every gate (``kernel_check``, ``ditbench``, ``golden``,
``quality_gate``): a :class:`~pytest_ditgate.errors.GateFailure` or ``DitgateUsageError`` shows the user's
code and the message, without the plugin's own frames (nor pluggy's between them, where the plugin calls its
own hook: their arguments are the tensors), and the short summary line starts with ``[reason]``; one raised
where no code of the user's runs (the ``golden`` fixture's teardown) shows as its message alone.
An exception raised by the user's own code inside a gate (a reference, ``make_inputs``, a timed function:
marked by :func:`pytest_ditgate.arguments.raised_by`) shows that code's traceback, without the plugin's
frames between the test and it. A test that fails because a device profile claims a GPU this machine does
not have fails with one line saying so. ``--full-trace`` keeps every frame. Registered by ``plugin.py``
under ``--ditgate``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

#: what torch says when CUDA is used on a machine without a usable NVIDIA GPU
_NO_CUDA = ("Found no NVIDIA driver", "Torch not compiled with CUDA enabled", "No CUDA GPUs are available",
            "CUDA driver initialization failed", "no CUDA-capable device",
            "CUDA driver version is insufficient for CUDA runtime version")


def _in_package(tb: Any, module_file: str) -> bool:
    """Whether a traceback frame runs code of the package whose ``__init__``/module file is ``module_file``."""
    package = os.path.dirname(os.path.abspath(module_file))
    return os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(package + os.sep)


def _in_plugin(tb: Any) -> bool:
    """Whether a traceback frame runs code of the installed pytest_ditgate package."""
    return _in_package(tb, __file__)


def _internal(chain: list[Any]) -> list[bool]:
    """For each frame of ``chain``, whether it is the plugin's own: a pytest_ditgate frame, or one of pluggy's
    between two of them (the plugin calling its own hook, ``pytest_ditgate_golden_check``: pluggy's frames
    would show the hook's arguments, the tensors' values among them). Pluggy's frames next to a frame of
    someone else's (a hook implementation of the user's that raised) are kept."""
    import pluggy

    ours = [_in_plugin(entry) for entry in chain]
    hooks = [_in_package(entry, pluggy.__file__) for entry in chain]
    internal = list(ours)
    start = None
    for index in range(len(chain) + 1):
        if index < len(chain) and hooks[index]:
            start = index if start is None else start
            continue
        if start is not None:
            before = start > 0 and ours[start - 1]
            after = index == len(chain) or ours[index]
            if before and after:
                internal[start:index] = [True] * (index - start)
            start = None
    return internal


def _entries(tb: Any) -> list[Any]:
    chain = []
    while tb is not None:
        chain.append(tb)
        tb = tb.tb_next
    return chain


def _drop_plugin_tail(tb: Any) -> None:
    """Unlink the trailing run of plugin frames from a traceback chain (the frames a gate raised from),
    keeping at least the first frame. pytest rebuilds tracebacks from the raw chain, so hiding has to
    happen there."""
    chain = _entries(tb)
    internal = _internal(chain)
    cut = len(chain)
    while cut > 1 and internal[cut - 1]:
        cut -= 1
    if cut < len(chain):
        chain[cut - 1].tb_next = None


def _has_user_frame(tb: Any) -> bool:
    """Whether the traceback holds a frame of anything but the plugin, pytest and pluggy: a gate failure raised
    where no code of the user's runs (the teardown of the ``golden`` fixture) is shown as its message alone."""
    import _pytest
    import pluggy

    return any(not (_in_plugin(entry) or _in_package(entry, _pytest.__file__) or _in_package(entry, pluggy.__file__))
               for entry in _entries(tb))


def _without_plugin_frames(tb: Any) -> Any:
    """The traceback chain relinked without the plugin's frames (pluggy's between them too: :func:`_internal`;
    at least one frame kept); returns its head."""
    chain = _entries(tb)
    kept = [entry for entry, internal in zip(chain, _internal(chain)) if not internal] or chain[:1]
    for entry, following in zip(kept, kept[1:] + [None]):
        entry.tb_next = following
    return kept[0] if kept else tb


def _chained(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions pytest shows with it (its cause, or its context unless suppressed)."""
    found: list[BaseException] = []
    while exc is not None and exc not in found:
        found.append(exc)
        exc = exc.__cause__ if exc.__cause__ is not None else (None if exc.__suppress_context__ else exc.__context__)
    return found


def _trim_user_code(exc: BaseException) -> None:
    """The exceptions chained to ``exc`` that the user's code raised keep only their own frames."""
    from pytest_ditgate.arguments import user_code_of

    for chained in _chained(exc)[1:]:
        if user_code_of(chained) is not None and chained.__traceback__ is not None:
            chained.__traceback__ = _without_plugin_frames(chained.__traceback__)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """Gate failures and API misuse read as the test and the message: drop plugin frames, put the
    message (``[reason] ...`` for a gate) first in the summary line (``--full-trace`` keeps every frame).
    An exception of the user's code keeps its own frames and the test's, not the plugin's between them."""
    from pytest_ditgate.arguments import user_code_of
    from pytest_ditgate.errors import DitgateUsageError, GateFailure

    excinfo = call.excinfo
    ours = (GateFailure, DitgateUsageError)
    value = excinfo.value if excinfo is not None else None
    failure = value if isinstance(value, ours) else None
    fulltrace = item.config.getoption("fulltrace", False)
    message_only = failure is not None and not fulltrace and not _has_user_frame(excinfo.tb)
    if value is not None and not fulltrace:
        if failure is not None:
            _drop_plugin_tail(excinfo.tb)
        elif user_code_of(value) is not None:
            _without_plugin_frames(excinfo.tb)  # the head is pytest's own frame, never the plugin's
        if failure is not None or user_code_of(value) is not None:
            excinfo.traceback = excinfo.traceback.__class__(excinfo.tb)
            _trim_user_code(value)
    report = yield
    if message_only and report.longrepr is not None:  # raised by a fixture of the plugin (its teardown)
        report.longrepr = excinfo.getrepr(style="value")
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    if failure is not None and crash is not None:
        crash.message = str(failure)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    """A fixture that uses CUDA under a GPU profile on a machine without one: one line (see below)."""
    return (yield from _one_line_without_device(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """A device profile stands in for skip decisions only: a test that then uses CUDA on a machine without
    a GPU fails with one line naming the profile, not torch's driver traceback."""
    return (yield from _one_line_without_device(item))


def _one_line_without_device(item: pytest.Item):
    try:
        return (yield)
    except Exception as exc:
        message = _profile_without_device(item.config, exc)
        if message is None:
            raise
        raise pytest.fail.Exception(message, pytrace=False) from None


def _profile_without_device(config: pytest.Config, exc: BaseException) -> str | None:
    """The one-line failure when ``exc`` comes from using CUDA while a profile claims a GPU this machine
    lacks; None otherwise."""
    if "torch" not in sys.modules:
        return None
    cause = next((e for e in _chained(exc) if _is_cuda_unavailable(e)), None)
    if cause is None:
        return None
    from pytest_ditgate.arguments import clip
    from pytest_ditgate.context import get_context
    from pytest_ditgate.device import real_device
    from pytest_ditgate.profiles import PROFILE_ENV

    try:
        device = get_context(config).device()
        real = real_device()
    except Exception:  # noqa: BLE001 - the report must never fail over this diagnosis
        return None
    if not (device.is_profile and device.is_cuda and not real.is_cuda):
        return None
    return (f"ditgate: {PROFILE_ENV}={os.environ.get(PROFILE_ENV)} stands in for skip decisions only: it claims "
            f"{device.name} ({device.arch}), but this machine has no CUDA GPU ({real.cpu_reason or real.describe()}), "
            f"and this test used CUDA ({clip(f'{type(cause).__name__}: {cause}', 120)}). Run it where that GPU is, "
            f"or without {PROFILE_ENV} (GPU tests then skip here)")


def _is_cuda_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` is torch refusing CUDA for want of a GPU or driver (its lazy CUDA init raised it, or a
    CUDA call outside it, such as ``torch.Generator("cuda")``, raised torch's ``AcceleratorError``)."""
    if any(text in str(exc) for text in _NO_CUDA):
        return True
    accelerator_error = getattr(sys.modules.get("torch"), "AcceleratorError", None)
    if isinstance(accelerator_error, type) and isinstance(exc, accelerator_error):
        return True
    suffix = os.path.join("torch", "cuda", "__init__.py")
    return any(entry.tb_frame.f_code.co_name == "_lazy_init" and entry.tb_frame.f_code.co_filename.endswith(suffix)
               for entry in _entries(exc.__traceback__))
