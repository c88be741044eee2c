"""The hooks pytest-ditgate calls, for plugins that observe a gated run (``pytest_addhooks`` in ``plugin.py``).

The judge's child (``experiment/child.py``) is their user: it saves every golden check's tensors for the judge
and observes a timed candidate once, untimed, through these hooks instead of replacing methods of live objects.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest


@pytest.hookspec(firstresult=True)
def pytest_ditgate_golden_check(name: str, key: str, tensors: Any, nodeid: str, optional: tuple[str, ...],
                                check: Callable[[], Any]) -> Any:
    """One ``golden.check`` of a test: ``check()`` compares ``tensors`` with the golden ``name`` under ``key``
    (or queues them in a freeze) and returns the result, or raises the gate's failure.

    A ``wrapper=True`` implementation sees the tensors before the comparison and may run it under its own
    conditions; the default implementation (``golden_plugin``) returns ``check()``."""


@pytest.hookspec
def pytest_ditgate_before_pair(candidate: Callable[..., Any], args: tuple[Any, ...],
                               kwargs: dict[str, Any]) -> None:
    """Called once before ``ditbench.pair`` checks and times ``candidate(*args, **kwargs)``, untimed: nothing may
    observe the timed calls (observation costs time), so an observer calls the candidate once here."""
