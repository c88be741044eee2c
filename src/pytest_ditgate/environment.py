"""Provenance of a run: the header line, ``.ditgate/environment.json`` and JUnit XML properties."""

from __future__ import annotations

import datetime as _dt
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_ditgate import __version__, toolchain
from pytest_ditgate.context import get_context
from pytest_ditgate.git import commit_id

if TYPE_CHECKING:
    from pytest_ditgate.device_info import DeviceInfo

ENVIRONMENT_FILE = "environment.json"
PACKAGES = ("torch", "triton", "diffusers", "torchmetrics", "lpips", "open-clip-torch", "nvidia-ml-py",
            "safetensors", "pytest", "pytest-benchmark", "pytest-xdist", "hypothesis", "numpy")


def environment_record(device: DeviceInfo, *, real: DeviceInfo | None = None, cwd: str | Path | None = None) -> dict[str, Any]:
    """Everything a number needs to be reproduced: device, versions, host, commit, time."""
    import platform

    record: dict[str, Any] = {
        "time_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "ditgate": __version__,
        "device": device.to_dict(),
        "profile": device.profile_name,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "host": platform.node(),
        "packages": {name: toolchain.package_version(name) for name in PACKAGES},
        "nvcc": toolchain.nvcc_version(),
        "commit": commit_id(cwd),
    }
    if real is not None and real is not device:
        record["real_device"] = real.to_dict()
    return record


def junit_properties(device: DeviceInfo) -> dict[str, str]:
    return {
        "ditgate_device": device.name,
        "ditgate_arch": device.arch,
        "ditgate_driver": device.driver or "",
        "ditgate_torch": device.torch or "",
        "ditgate_cuda": device.cuda_runtime or "",
        "ditgate_device_source": device.source,
    }


def pytest_report_header(config: pytest.Config) -> list[str]:
    context = get_context(config)
    return [f"ditgate: {context.device().header_line()}"]


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    """Write ``environment.json`` once (the xdist controller, or a plain run), when the tests are about to run:
    a run that stops at a usage error in collection (a bad marker) writes nothing. Never fails the run on I/O."""
    context = get_context(session.config)
    if context.is_xdist_worker:
        return
    from pytest_ditgate.device import real_device
    from pytest_ditgate.fsutil import atomic_write_json

    device = context.device()
    real = real_device() if device.is_profile else None
    try:
        atomic_write_json(context.artefact_path(ENVIRONMENT_FILE),
                          environment_record(device, real=real, cwd=session.config.rootpath))
    except OSError as exc:
        session.config.issue_config_time_warning(
            pytest.PytestWarning(f"ditgate: could not write {ENVIRONMENT_FILE}: {exc}"), stacklevel=2)


@pytest.fixture(scope="session", autouse=True)
def _ditgate_junit_properties(request: pytest.FixtureRequest) -> None:
    """Device provenance as JUnit XML test-suite properties (a no-op without ``--junitxml``)."""
    if request.config.getoption("xmlpath", default=None) is None:
        return
    record = request.getfixturevalue("record_testsuite_property")
    for name, value in junit_properties(get_context(request.config).device()).items():
        record(name, value)
