"""Every ``StashKey`` the plugin uses, in one place (pytest's ``config.stash`` holds all plugin state)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytest_ditgate.context import DitgateContext

#: the session-wide ditgate state, built once in ``pytest_configure``
context_key = pytest.StashKey["DitgateContext"]()
