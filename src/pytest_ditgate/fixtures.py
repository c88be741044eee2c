"""Core fixtures: the device a gate runs on and the run's artefact folder."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_ditgate.context import get_context

if TYPE_CHECKING:
    from pytest_ditgate.device_info import DeviceInfo


@pytest.fixture(scope="session")
def ditgate_device(pytestconfig: pytest.Config) -> "DeviceInfo":
    """The device skip decisions use (the profile in force, or the detected device)."""
    return get_context(pytestconfig).device()


@pytest.fixture(scope="session")
def ditgate_artefacts(pytestconfig: pytest.Config) -> Path:
    """The run's artefact folder (``--ditgate-dir``, default ``<rootdir>/.ditgate``), created on use."""
    path = get_context(pytestconfig).artefact_dir
    path.mkdir(parents=True, exist_ok=True)
    return path
