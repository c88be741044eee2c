"""pytest entry point (``pytest11: ditgate``): options, markers and the registration of each concern.

Every pytest run in an environment with the plugin installed pays for what this module imports, so it
imports only the standard library, pytest, and small option-declaring modules. Each concern (skipping,
environment, correctness, timing, golden store, quality, verdict) is its own plugin module; those that
only matter when the gates are on are imported and registered in ``pytest_configure`` under
``--ditgate`` alone. Gate tests are skipped with a reason when the gates are off, before any of their
fixtures would be looked up.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest

from pytest_ditgate import options
from pytest_ditgate.context import DitgateContext, context_key
from pytest_ditgate.errors import DitgateUsageError

#: light modules declaring each concern's options (``OPTIONS``), imported at every pytest start
OPTION_MODULES = (
    "pytest_ditgate.correctness.options",
    "pytest_ditgate.bench.options",
    "pytest_ditgate.golden.options",
    "pytest_ditgate.quality.options",
    "pytest_ditgate.verdict.options",
)
#: concern plugins registered in every run (cheap: marker validation, the gates-off skip)
ALWAYS = ("pytest_ditgate.skipping",)
#: concern plugins registered only when the gates are on (``--ditgate``)
WHEN_ENABLED = (
    "pytest_ditgate.environment",
    "pytest_ditgate.gpus",
    "pytest_ditgate.fixtures",
    "pytest_ditgate.reporting",
    "pytest_ditgate.verdict.candidate",
    "pytest_ditgate.verdict.lane",
    "pytest_ditgate.verdict.plugin",
    "pytest_ditgate.quality.quality_plugin",
    "pytest_ditgate.correctness.plugin",
    "pytest_ditgate.bench.plugin",
    "pytest_ditgate.golden.golden_plugin",
    "pytest_ditgate.golden.fixed_paths",
)


def _modules(names: tuple[str, ...]) -> list[ModuleType]:
    return [importlib.import_module(name) for name in names]


def concern_options() -> list[options.OptionSpec]:
    """Every concern's option specs (not the core ones)."""
    return [spec for module in _modules(OPTION_MODULES) for spec in module.OPTIONS]


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from pytest_ditgate import hookspec

    pluginmanager.add_hookspecs(hookspec)


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser, options.CORE_OPTIONS)
    options.add_options(parser, concern_options())


def pytest_configure(config: pytest.Config) -> None:
    from pytest_ditgate.skipping import MARKER_DOCS

    for line in MARKER_DOCS:
        config.addinivalue_line("markers", line)
    context = DitgateContext.from_config(config)
    config.stash[context_key] = context
    if not context.enabled:
        _refuse_gate_flags_without_gates(config)
    else:  # every ini value checked now: a typo is exit 4 before any test, not an error in the 50th
        unknown = options.unknown_ini_keys(config, [*options.CORE_OPTIONS, *concern_options()])
        if unknown:
            raise pytest.UsageError("; ".join(unknown))
        options.validate_all(config, concern_options())
    names = ALWAYS + (WHEN_ENABLED if context.enabled else ())
    for module in _modules(names):
        if not config.pluginmanager.is_registered(module):
            config.pluginmanager.register(module, module.__name__)
    if context.target:
        _check_target(context)


def _refuse_gate_flags_without_gates(config: pytest.Config) -> None:
    """A gate flag on the command line without ``--ditgate`` would silently do nothing: say so instead."""
    given = [spec.flag for spec in concern_options() if config.getoption(spec.dest, default=None) not in (None, False)]
    if given:
        verb = "needs" if len(given) == 1 else "need"
        raise pytest.UsageError(f"{', '.join(given)} {verb} --ditgate (the gates are off without it)")


def _check_target(context: DitgateContext) -> None:
    """The target is checked against the machine's real device: a device profile changes skip decisions only,
    so a runner without its GPU cannot pass ``--ditgate-target=a5500`` by naming an A5500 profile."""
    from pytest_ditgate.device import real_device
    from pytest_ditgate.target import evaluate_target

    try:
        device = context.device()  # a bad DITGATE_DEVICE_PROFILE is a usage error here too
        real = real_device()
        mismatch = evaluate_target(context.target or "", real, profile=device.profile_name)
    except DitgateUsageError as exc:
        raise pytest.UsageError(str(exc)) from None
    if mismatch is not None:
        raise pytest.UsageError(mismatch.message)
