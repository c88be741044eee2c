"""Provenance of a run: the header line, ``.ditgate/environment.json`` and JUnit XML properties.

``environment.json`` records the versions of the usual stack (:data:`PACKAGES`) and of the libraries under
test: every distribution a collected test names in ``requires_gpu(packages=...)`` and every one the project
lists in ``[tool.ditgate] packages`` (``packages_under_test`` names them; a missing one is recorded as
null). The file is written when the session starts and completed once the tests are collected (by the
controller of a plain run, or the first xdist worker).
"""

from __future__ import annotations

import datetime as _dt
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_ditgate import __version__, toolchain
from pytest_ditgate.context import get_context
from pytest_ditgate.errors import DitgateUsageError
from pytest_ditgate.git import commit_id

if TYPE_CHECKING:
    from pytest_ditgate.device_info import DeviceInfo

ENVIRONMENT_FILE = "environment.json"
PACKAGES = ("torch", "triton", "diffusers", "torchmetrics", "lpips", "open-clip-torch", "nvidia-ml-py",
            "safetensors", "pytest", "pytest-benchmark", "pytest-xdist", "hypothesis", "numpy")


#: the ``[tool.ditgate]`` key listing a project's libraries under test (distribution names, as pip has them)
PROJECT_PACKAGES_KEY = "packages"


def project_packages(root: str | Path) -> list[str]:
    """The distributions ``[tool.ditgate] packages`` lists (a usage error when it is not a list of strings)."""
    from pytest_ditgate.project_config import load_project_config, string_list

    return string_list(load_project_config(root), PROJECT_PACKAGES_KEY)


def marker_packages(items: list[pytest.Item]) -> list[str]:
    """The distributions the collected tests name in ``requires_gpu(packages=...)`` (a bad marker is skipped
    here; the marker check reports it)."""
    from pytest_ditgate.requirements import parse_requirements

    names: set[str] = set()
    for item in items:
        for mark in item.iter_markers("requires_gpu"):
            try:
                names.update(name for name, _ in parse_requirements(mark.args, dict(mark.kwargs)).packages)
            except DitgateUsageError:
                continue
    return sorted(names)


def with_packages(record: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """``record`` with the versions of ``names`` added to its packages and to ``packages_under_test``."""
    under_test = sorted(set(record.get("packages_under_test", [])) | set(names))
    packages = dict(record.get("packages", {}))
    packages.update({name: toolchain.package_version(name) for name in under_test})
    return {**record, "packages": packages, "packages_under_test": under_test}


def environment_record(device: DeviceInfo, *, real: DeviceInfo | None = None, cwd: str | Path | None = None,
                       under_test: list[str] = ()) -> dict[str, Any]:
    """Everything a number needs to be reproduced: device, versions (``under_test``: the distributions of
    the libraries under test), host, commit, time."""
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
    return with_packages(record, list(under_test))


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
        listed = [*project_packages(session.config.rootpath), *marker_packages(session.items)]
    except DitgateUsageError as exc:
        raise pytest.UsageError(str(exc)) from None
    try:
        atomic_write_json(context.artefact_path(ENVIRONMENT_FILE),
                          environment_record(device, real=real, cwd=session.config.rootpath, under_test=listed))
    except OSError as exc:
        session.config.issue_config_time_warning(
            pytest.PytestWarning(f"ditgate: could not write {ENVIRONMENT_FILE}: {exc}"), stacklevel=2)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Under xdist, add the versions of the distributions the collected tests' markers name (the first worker
    writes: the controller collects nothing; a plain run records them with the rest, in
    :func:`pytest_runtestloop`)."""
    config = session.config
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker != "gw0":
        return
    names = marker_packages(session.items)
    if not names:
        return
    from pytest_ditgate.fsutil import atomic_write_json, lock_for, read_json_object

    path = get_context(config).artefact_path(ENVIRONMENT_FILE)
    try:
        with lock_for(path):
            record = read_json_object(path, what="environment record") or {}
            atomic_write_json(path, with_packages(record, names))
    except Exception as exc:  # noqa: BLE001 - provenance is best effort: never fail a run over it
        warnings.warn(pytest.PytestWarning(f"ditgate: could not add the tested packages to {ENVIRONMENT_FILE}: "
                                           f"{exc}"), stacklevel=2)


@pytest.fixture(scope="session", autouse=True)
def _ditgate_junit_properties(request: pytest.FixtureRequest) -> None:
    """Device provenance as JUnit XML test-suite properties (a no-op without ``--junitxml``)."""
    if request.config.getoption("xmlpath", default=None) is None:
        return
    record = request.getfixturevalue("record_testsuite_property")
    for name, value in junit_properties(get_context(request.config).device()).items():
        record(name, value)
