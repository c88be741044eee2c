"""Every ``StashKey`` the plugin uses, in one place (pytest's ``config.stash`` holds all plugin state)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytest_ditgate.context import DitgateContext
    from pytest_ditgate.verdict.classify import Classification
    from pytest_ditgate.golden.golden_plugin import GoldenPluginState

#: the session-wide ditgate state, built once in ``pytest_configure``
context_key = pytest.StashKey["DitgateContext"]()

#: per test item: one ``(label, passed, reason)`` tuple per ``kernel_check`` call in that test, so that
#: ``ditbench`` can refuse to time an output that failed its reference check (correct before fast)
kernel_checks_key = pytest.StashKey["list[tuple[str, bool, str | None]]"]()

#: the run's golden-store session (``pytest_ditgate.golden``), built in its ``pytest_configure``
golden_session_key = pytest.StashKey["GoldenPluginState"]()

#: the experiment class this process judges the candidate as, once a gate suite declared its candidate
#: (``ditgate_candidate.declare``): the declared class, or a stricter one the evidence forces
effective_class_key = pytest.StashKey["Classification"]()
