"""The ``kernel_check`` fixture; its defaults come from ``--ditgate-kernel-trials``/``--ditgate-kernel-seed``
(declared in ``correctness/options.py``).

Registered by ``plugin.py`` under ``--ditgate``; torch is imported only when a test calls the fixture. Each
call is recorded on the test item as ``(label, passed, reason)`` under :data:`kernel_checks_key`, so the
timing fixture can refuse to time a kernel whose output failed its reference check. How its failures
are reported (trimmed traceback, ``[reason]`` first) is ``reporting.py``'s, shared by every gate.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

from pytest_ditgate import options
from pytest_ditgate.correctness.options import SEED, TRIALS

#: per test item: one ``(label, passed, reason)`` tuple per ``kernel_check`` call in that test, so that
#: ``ditbench`` can refuse to time an output that failed its reference check (correct before fast)
kernel_checks_key = pytest.StashKey["list[tuple[str, bool, str | None]]"]()


class KernelCheck:
    """Callable handed to tests by the ``kernel_check`` fixture: ``check_kernel`` plus recording."""

    def __init__(self, record: Callable[[str, bool, "str | None"], None], defaults: dict[str, Any]) -> None:
        self._record = record
        self._defaults = defaults
        self.reports: list[Any] = []

    def __repr__(self) -> str:  # pytest prints the fixture beside a failing test: keep it one short line
        return f"<kernel_check fixture: {len(self.reports)} check(s) run>"

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
