"""How a gate's failure reads in pytest's report, for every gate (``kernel_check``, ``ditbench``, ``golden``,
``quality_gate``): a :class:`~pytest_ditgate.errors.GateFailure` or ``DitgateUsageError`` shows the user's
code and the message, without the plugin's own frames, and the short summary line starts with ``[reason]``.
Registered by ``plugin.py`` under ``--ditgate``.
"""

from __future__ import annotations

from typing import Any

import pytest


def _in_plugin(tb: Any) -> bool:
    """Whether a traceback frame runs code of the installed pytest_ditgate package."""
    import os

    package = os.path.dirname(os.path.abspath(__file__))
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
