"""Every ``StashKey`` the plugin uses, in one place (pytest's ``config.stash`` holds all plugin state)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytest_ditgate.context import DitgateContext

#: the session-wide ditgate state, built once in ``pytest_configure``
context_key = pytest.StashKey["DitgateContext"]()

#: per test item: one ``(label, passed, reason)`` tuple per ``kernel_check`` call in that test, so that
#: ``ditbench`` can refuse to time an output that failed its reference check (correct before fast)
kernel_checks_key = pytest.StashKey["list[tuple[str, bool, str | None]]"]()
