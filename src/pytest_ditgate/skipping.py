"""The ``requires_gpu`` capability marker and the gates-off skip.

Deciding is kept apart from acting: :func:`evaluate_device_marks` returns a frozen :class:`Skip` (or
None) and the hooks only act on it, like pytest's own ``skipping.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from pytest_ditgate.context import GATE_FIXTURES, GATE_MARKERS, OFF_REASON, get_context
from pytest_ditgate.errors import DitgateUsageError

if TYPE_CHECKING:
    from pytest_ditgate.device_info import DeviceInfo
    from pytest_ditgate.requirements import Requirements

MARKER_DOCS = (
    "requires_gpu(cc=None, min_memory_gb=None, bf16=False, fp8=False, tf32=False, sdpa=(), gpus=1, "
    "nvcc=False, triton=False, packages=(), why=None): run only on a device with these capabilities; bare, "
    "any CUDA GPU. cc takes '>=8.0', '==8.6', '8.0-8.9', '>=8.0,<9.0' or a list of alternatives; packages "
    "takes installed distributions like 'quack-kernels>=0.6.5'.",
    "ditgate: a gate test; skipped unless pytest runs with --ditgate.",
)


@dataclass(frozen=True)
class Skip:
    reason: str


def import_or_skip(module: str, package: str | list[str] | None = None, *, why: str | None = None) -> Any:
    """Import ``module`` for a test module that uses it at its top, where ``requires_gpu(packages=...)``
    comes too late (a missing package is then a collection error): when ``package`` (pip's distribution
    name, with an optional version spec: ``"liger-kernel>=0.8.5"``; default ``module``) is missing or too
    old, the whole module is skipped with the marker's wording (``needs liger-kernel>=0.8.5 (not installed)
    for fused kernels``). ``liger = import_or_skip("liger_kernel", "liger-kernel>=0.8.5")``."""
    import importlib

    from pytest_ditgate.requirements import missing_packages

    missing = missing_packages(package if package is not None else module)
    if missing:
        purpose = f" for {why}" if why else ""
        pytest.skip(f"needs {', '.join(missing)}{purpose}", allow_module_level=True)
    return importlib.import_module(module)


def item_requirements(item: pytest.Item) -> list["Requirements"]:
    """Every ``requires_gpu`` marker on ``item``, parsed (raises DitgateUsageError on a bad one)."""
    marks = list(item.iter_markers("requires_gpu"))
    if not marks:
        return []
    from pytest_ditgate.requirements import parse_requirements

    return [parse_requirements(mark.args, dict(mark.kwargs)) for mark in marks]


def _conflict(requirements: list["Requirements"]) -> str | None:
    from pytest_ditgate.requirements import conflict

    return conflict(requirements)


def evaluate_device_marks(requirements: list["Requirements"], device: "DeviceInfo") -> Skip | None:
    """The skip decision on ``device`` for a test's parsed markers: the first unmet marker's reason, or None."""
    from pytest_ditgate.requirements import skip_reason

    for requirement in requirements:
        reason = skip_reason(requirement, device)
        if reason is not None:
            return Skip(reason)
    return None


def pytest_configure(config: pytest.Config) -> None:
    """With the gates on, a device profile named by ``DITGATE_DEVICE_PROFILE`` is read and validated now:
    a bad one is a usage error (exit 4) before any test runs, never an INTERNALERROR later."""
    if not get_context(config).enabled:
        return  # inert: nothing reads the profile, and nothing heavy is imported
    import os

    from pytest_ditgate.profiles import PROFILE_ENV, read_profile

    spec = os.environ.get(PROFILE_ENV)
    if not spec:
        return

    try:
        read_profile(spec)
    except DitgateUsageError as exc:
        raise pytest.UsageError(f"{PROFILE_ENV}={spec!r}: {exc}") from None


def is_gate_test(item: pytest.Item) -> bool:
    fixturenames = set(getattr(item, "fixturenames", ()))
    return bool(fixturenames & GATE_FIXTURES) or any(item.get_closest_marker(m) for m in GATE_MARKERS)


def _marker_name(line: str) -> str:
    return line.split(":", 1)[0].split("(", 1)[0].strip()


#: the plugin's own markers, as registered in ``pytest_configure``
PLUGIN_MARKERS = tuple(_marker_name(line) for line in MARKER_DOCS)


def misspelt_markers(config: pytest.Config, items: list[pytest.Item]) -> list[str]:
    """``<nodeid>: unknown marker 'require_gpu': did you mean requires_gpu?`` for each mark close to one of
    the plugin's markers but registered by nobody: pytest only warns about it, and the test would run without
    the requirement it meant to state."""
    import difflib

    registered = {_marker_name(line) for line in config.getini("markers")}
    problems = []
    for item in items:
        for mark in item.iter_markers():
            if mark.name in registered:
                continue
            close = difflib.get_close_matches(mark.name, PLUGIN_MARKERS, n=1, cutoff=0.6)
            if close:
                problems.append(f"{item.nodeid}: unknown marker {mark.name!r}: did you mean {close[0]}? (a misspelt "
                                "ditgate marker states no requirement, so the test would run unguarded)")
    return problems


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Reject malformed requirement markers at collection (and, with the gates on, misspelt ditgate
    markers); mark gate tests skipped when gates are off."""
    problems = []
    marked: dict[pytest.Item, list[Requirements]] = {}  # each item's markers, parsed once
    context = get_context(config)
    if context.enabled:
        misspelt = misspelt_markers(config, items)
        if misspelt:
            raise pytest.UsageError("misspelt marker(s):\n  " + "\n  ".join(dict.fromkeys(misspelt)))
    for item in items:
        try:
            requirements = item_requirements(item)
        except DitgateUsageError as exc:
            problems.append(f"{item.nodeid}: {exc}")
            continue
        clash = _conflict(requirements) if requirements else None
        if clash:
            problems.append(f"{item.nodeid}: requires_gpu: {clash} (the test would skip on every device)")
        elif requirements:
            marked[item] = requirements
    if problems:
        raise pytest.UsageError("bad requires_gpu marker(s):\n  " + "\n  ".join(problems))
    if not context.enabled:
        off = pytest.mark.skip(reason=OFF_REASON)
        for item in items:
            if is_gate_test(item):
                item.add_marker(off)
        return
    if not marked:
        return  # no device probe (and no torch import) for suites that never ask for a GPU
    device = context.device()
    for item, requirements in marked.items():
        decision = evaluate_device_marks(requirements, device)
        if decision is not None:
            item.add_marker(pytest.mark.skip(reason=decision.reason))
