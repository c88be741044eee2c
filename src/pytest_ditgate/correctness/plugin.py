"""The ``kernel_check`` fixture; its defaults come from ``--ditgate-kernel-trials``/``--ditgate-kernel-seed``
(declared in ``correctness/options.py``).

Registered by ``plugin.py`` under ``--ditgate``; torch is imported only when a test calls the fixture. Each
call is recorded on the test item as ``(label, passed, reason)`` under ``keys.kernel_checks_key``, so the
timing fixture can refuse to time a kernel whose output failed its reference check.

A :class:`~pytest_ditgate.errors.GateFailure` (or a ``DitgateUsageError``) raised in a test
(``kernel_check``, ``ditbench``, ``golden``, ``quality_gate``) is reported as the user's code and the
gate's message: the plugin's own frames are left out of the traceback and the short summary line starts
with ``[reason]``.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

from pytest_ditgate import options
from pytest_ditgate.correctness.options import SEED, TRIALS
from pytest_ditgate.keys import kernel_checks_key


class KernelCheck:
    """Callable handed to tests by the ``kernel_check`` fixture: ``check_kernel`` plus recording."""

    def __init__(self, record: Callable[[str, bool, "str | None"], None], defaults: dict[str, Any]) -> None:
        self._record = record
        self._defaults = defaults
        self.reports: list[Any] = []

    def __call__(self, candidate: Callable[..., Any], reference: Callable[..., Any],
                 make_inputs: Callable[[int], Any], *, label: str | None = None, **kwargs: Any) -> Any:
        """Run :func:`pytest_ditgate.check_kernel`; record ``(label, passed, reason)``; return the report."""
        __tracebackhide__ = True
        from pytest_ditgate.correctness.checks import check_kernel
        from pytest_ditgate.errors import GateFailure

        name = label or getattr(candidate, "__qualname__", None) or f"kernel_check#{len(self.reports) + 1}"
        try:
            report = check_kernel(candidate, reference, make_inputs, label=name, **{**self._defaults, **kwargs})
        except GateFailure as failure:
            self._record(name, False, failure.reason)
            if failure.report is not None:
                self.reports.append(failure.report)
            raise
        except BaseException:
            self._record(name, False, "error")
            raise
        self._record(name, True, None)
        self.reports.append(report)
        return report


@pytest.fixture
def kernel_check(request: pytest.FixtureRequest) -> KernelCheck:
    """Check a candidate kernel against a reference (see ``pytest_ditgate.check_kernel``); records each call."""
    item = request.node

    def record(label: str, passed: bool, reason: str | None) -> None:
        item.stash.setdefault(kernel_checks_key, []).append((label, passed, reason))

    defaults = {}
    trials = options.get_option(request.config, TRIALS)
    seed = options.get_option(request.config, SEED)
    if trials is not None:
        defaults["trials"] = trials
    if seed is not None:
        defaults["seed"] = seed
    return KernelCheck(record, defaults)


def _in_plugin(tb: Any) -> bool:
    """Whether a traceback frame runs code of the installed pytest_ditgate package."""
    import os

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(package + os.sep)


def _drop_plugin_tail(tb: Any) -> None:
    """Unlink the trailing run of plugin frames from a traceback chain (the frames a gate raised from),
    keeping at least the first frame. pytest rebuilds tracebacks from the raw chain, so hiding has to
    happen there."""
    chain = []
    while tb is not None:
        chain.append(tb)
        tb = tb.tb_next
    cut = len(chain)
    while cut > 1 and _in_plugin(chain[cut - 1]):
        cut -= 1
    if cut < len(chain):
        chain[cut - 1].tb_next = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """Gate failures and API misuse read as the test and the message: drop plugin frames, put the
    message (``[reason] ...`` for a gate) first in the summary line (``--full-trace`` keeps every frame)."""
    from pytest_ditgate.errors import DitgateUsageError, GateFailure

    excinfo = call.excinfo
    ours = (GateFailure, DitgateUsageError)
    failure = excinfo.value if excinfo is not None and isinstance(excinfo.value, ours) else None
    if failure is not None and not item.config.getoption("fulltrace", False):
        _drop_plugin_tail(excinfo.tb)
        excinfo.traceback = excinfo.traceback.__class__(excinfo.tb)
    report = yield
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    if failure is not None and crash is not None:
        crash.message = str(failure)
    return report
