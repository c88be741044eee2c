"""pytest entry point (``pytest11: ditgate``): options, markers and the registration of each concern.

Only the standard library and pytest are imported here and in every module it imports at load time:
an installed plugin must not make pytest runs that never use a gate pay for torch or NVML.
Each concern (skipping, environment, correctness, timing, golden store, verdict) is its own plugin
module, registered in ``pytest_configure``; modules that contribute options list them as ``OPTIONS``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest

from pytest_ditgate import options
from pytest_ditgate.context import DitgateContext
from pytest_ditgate.errors import DitgateUsageError
from pytest_ditgate.keys import context_key

#: concern plugins registered in every run (they stay cheap: no heavy imports, gates check ``enabled``)
ALWAYS = ("pytest_ditgate.skipping",)
#: concern plugins registered only when the gates are on (``--ditgate``)
WHEN_ENABLED = ("pytest_ditgate.environment", "pytest_ditgate.gpus", "pytest_ditgate.verdict.plugin")
#: concern plugins that provide fixtures and options; registered always so that their fixtures resolve
#: (gate tests using them are skipped when the gates are off)
FIXTURE_PROVIDERS: tuple[str, ...] = (
    "pytest_ditgate.fixtures",
    "pytest_ditgate.verdict.candidate",
    "pytest_ditgate.verdict.lane",
    "pytest_ditgate.quality.quality_plugin",
    "pytest_ditgate.correctness.plugin",
    "pytest_ditgate.bench.plugin",
    "pytest_ditgate.golden.golden_plugin", "pytest_ditgate.golden.fixed_paths",
)


def _modules(names: tuple[str, ...]) -> list[ModuleType]:
    return [importlib.import_module(name) for name in names]


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser, options.CORE_OPTIONS)
    for module in _modules(ALWAYS + WHEN_ENABLED + FIXTURE_PROVIDERS):
        options.add_options(parser, getattr(module, "OPTIONS", ()))


def pytest_configure(config: pytest.Config) -> None:
    from pytest_ditgate.skipping import MARKER_DOCS

    for line in MARKER_DOCS:
        config.addinivalue_line("markers", line)
    context = DitgateContext.from_config(config)
    config.stash[context_key] = context
    names = ALWAYS + FIXTURE_PROVIDERS + (WHEN_ENABLED if context.enabled else ())
    for module in _modules(names):
        if not config.pluginmanager.is_registered(module):
            config.pluginmanager.register(module, module.__name__)
    if context.target:
        _check_target(context)


def _check_target(context: DitgateContext) -> None:
    from pytest_ditgate.target import evaluate_target

    try:
        mismatch = evaluate_target(context.target or "", context.device())
    except DitgateUsageError as exc:
        raise pytest.UsageError(str(exc)) from None
    if mismatch is not None:
        raise pytest.UsageError(mismatch.message)
