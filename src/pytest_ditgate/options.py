"""Option declarations: each ditgate option exists once, as a command-line flag and an ini key.

Concern modules declare their options as :class:`OptionSpec` lists; ``plugin.py`` adds them all to the
single ``ditgate`` option group. Values are read back with :func:`get_option`, which prefers the
command line, then ``[tool.pytest.ini_options]``, then the default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import pytest

GROUP_NAME = "ditgate"
GROUP_DESCRIPTION = "ditgate: GPU correctness, speed and quality gates"


@dataclass(frozen=True)
class OptionSpec:
    """One ditgate option: ``--ditgate-foo`` on the command line and ``ditgate_foo`` in the ini file."""

    flag: str
    help: str
    kind: str = "string"  # "bool" or "string"
    default: Any = None
    choices: tuple[str, ...] | None = None
    parse: Callable[[str], Any] | None = None  # validates at argument-parsing time

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def ini(self) -> str:
        return self.dest


def _argparse_type(spec: OptionSpec) -> Callable[[str], Any] | None:
    if spec.parse is None:
        return None
    parse = spec.parse

    def checked(text: str) -> Any:
        import argparse

        try:
            return finite(parse(text))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{spec.flag}: {exc}") from None

    return checked


def finite(value: Any) -> Any:
    """``value``, unless it is a float that is NaN or infinite (no ditgate option means those)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"must be a finite number, got {value!r}")
    return value


def add_options(parser: pytest.Parser, specs: Iterable[OptionSpec]) -> None:
    """Add ``specs`` to the ``ditgate`` group and as ini keys."""
    group = parser.getgroup(GROUP_NAME, GROUP_DESCRIPTION)
    for spec in specs:
        if spec.kind == "bool":
            group.addoption(spec.flag, dest=spec.dest, action="store_const", const=True, default=None,
                            help=spec.help)
            parser.addini(spec.ini, spec.help, type="bool", default=bool(spec.default))
        else:
            group.addoption(spec.flag, dest=spec.dest, default=None, choices=spec.choices,
                            type=_argparse_type(spec), help=spec.help)
            parser.addini(spec.ini, spec.help, type="string",
                          default="" if spec.default is None else str(spec.default))


#: the options an empty value means something for (an empty description); any other given empty is refused
EMPTY_ALLOWED = frozenset({"--ditgate-description"})


def get_option(config: pytest.Config, spec: OptionSpec) -> Any:
    """The option's value: command line, else ini, else default; ini strings are validated like flags."""
    value = config.getoption(spec.dest, default=None)
    if value is not None:
        if isinstance(value, str) and not value.strip() and spec.flag not in EMPTY_ALLOWED:
            raise pytest.UsageError(f"{spec.flag} is given an empty value (an unset variable in a script?): give a "
                                    "value, or leave the option out for its default")
        return value
    try:
        raw = config.getini(spec.ini)
    except (ValueError, TypeError, pytest.UsageError) as exc:  # a bool ini key holding "maybe" (pytest 9: UsageError)
        raise pytest.UsageError(f"ini option {spec.ini}: {exc}; use true or false") from None
    if isinstance(raw, (int, float)) and not isinstance(raw, bool) and spec.kind != "bool":
        raw = str(raw)  # a TOML number: read as the command line's text
    if not isinstance(raw, (str, bool)):  # a TOML list or table where one value goes
        raise pytest.UsageError(f"ini option {spec.ini}={raw!r}: must be one value (a string, number or boolean), "
                                f"not a {type(raw).__name__}")
    if spec.kind == "bool":
        return bool(raw)
    if raw in ("", None):
        return spec.default
    if spec.choices is not None and raw not in spec.choices:
        raise pytest.UsageError(f"ini option {spec.ini}={raw!r}: choose from {', '.join(spec.choices)}")
    if spec.parse is not None:
        try:
            return finite(spec.parse(raw))
        except ValueError as exc:
            raise pytest.UsageError(f"ini option {spec.ini}={raw!r}: {exc}") from None
    return raw


def validate_all(config: pytest.Config, specs: Iterable[OptionSpec]) -> None:
    """Read every option once, so that a bad ini value is a usage error at start, not when first used; and refuse
    a misspelt ditgate environment variable (:func:`misspelt_variables`)."""
    import os

    for spec in specs:
        get_option(config, spec)
    misspelt = misspelt_variables(os.environ)
    if misspelt:
        raise pytest.UsageError("; ".join(misspelt))


#: the environment variables a user sets for a pytest run (others named ``DITGATE_*`` may be a project's own)
USER_VARIABLES = ("DITGATE_DIR", "DITGATE_DEVICE_PROFILE")
#: names a user may reach for instead of one of :data:`USER_VARIABLES`
_VARIABLE_ALIASES = {"DITGATE_PROFILE": "DITGATE_DEVICE_PROFILE", "DITGATE_ARTEFACT_DIR": "DITGATE_DIR",
                     "DITGATE_ARTIFACT_DIR": "DITGATE_DIR"}


def _edits(a: str, b: str) -> int:
    """The Levenshtein distance of ``a`` and ``b``."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (x != y))
    return row[-1]


def misspelt_variables(environ: Any) -> list[str]:
    """``environment variable DITGATE_DIRR: not a ditgate variable; did you mean 'DITGATE_DIR'?`` for each set
    variable within two edits of one of :data:`USER_VARIABLES` (or a known alias): the run would go on without it
    (artefacts in the default folder, the real device instead of a profile). Other ``DITGATE_*`` names are left
    alone: a project may use the prefix for its own (this repository's kernels do)."""
    found = []
    for name in sorted(str(key) for key in environ):
        if not name.startswith("DITGATE") or name in USER_VARIABLES:
            continue
        meant = _VARIABLE_ALIASES.get(name) or next((known for known in USER_VARIABLES if _edits(name, known) <= 2),
                                                    None)
        if meant:
            found.append(f"environment variable {name}: not a ditgate variable; did you mean {meant!r}?")
    return found


def ini_keys(config: pytest.Config) -> set[str]:
    """The keys the run's ini file sets (``[pytest]``, ``[tool:pytest]``, ``[tool.pytest.ini_options]`` or
    ``[tool.pytest]``), and those given with ``-o``: read from the file pytest chose (``config.inipath``)."""
    import configparser

    keys: set[str] = set()
    path = config.inipath
    if path is not None and path.is_file():
        if path.suffix == ".toml":
            from pytest_ditgate.project_config import read_pyproject

            try:
                tool = read_pyproject(path).get("tool", {})
            except ValueError:
                tool = {}
            table = tool.get("pytest", {}) if isinstance(tool, dict) else {}
            if isinstance(table, dict):
                options = table.get("ini_options", {})
                keys.update(k for k in table if k != "ini_options")
                keys.update(options if isinstance(options, dict) else ())
        else:
            parser = configparser.ConfigParser(interpolation=None)
            try:
                parser.read(path, encoding="utf-8")
            except (configparser.Error, UnicodeDecodeError):
                pass
            for section in ("pytest", "tool:pytest"):
                if parser.has_section(section):
                    keys.update(parser.options(section))
    for override in config.getoption("override_ini", default=None) or ():
        keys.add(str(override).split("=", 1)[0].strip())
    return keys


def unknown_ini_keys(config: pytest.Config, specs: Iterable[OptionSpec]) -> list[str]:
    """``ini option ditgate_bench_budget: not a ditgate setting; did you mean 'ditgate_bench_budget_ms'?`` for each
    ``ditgate*`` ini key no option declares: pytest only warns about an unknown key, and the run would go on
    without the setting meant."""
    from pytest_ditgate.arguments import did_you_mean

    known = {spec.ini for spec in specs}
    return [f"ini option {key}: not a ditgate setting{did_you_mean(key, sorted(known))}"
            for key in sorted(ini_keys(config)) if key.startswith("ditgate") and key not in known]


def positive_int(text: str) -> int:
    """``type=`` parser: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise ValueError(f"must be >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """``type=`` parser: a number > 0."""
    value = finite(float(text))
    if value <= 0:
        raise ValueError(f"must be > 0, got {value}")
    return value


def noise_floor_text(text: str) -> float:
    """``type=`` parser of ``--ditgate-min-improvement``: a lane's noise floor
    (:func:`~pytest_ditgate.project_config.noise_floor`) given as text."""
    from pytest_ditgate.project_config import noise_floor

    return noise_floor(float(text))


ENABLE = OptionSpec("--ditgate", "turn the ditgate gates on (without it gate tests are skipped)", kind="bool")
TARGET = OptionSpec(
    "--ditgate-target",
    "the device this runner must have: a profile name (a5500, h200, ...) or an arch (sm_86); "
    "a mismatch fails the session at start instead of skipping every GPU test",
)
ARTEFACT_DIR = OptionSpec(
    "--ditgate-dir",
    "where run artefacts go (ledger, environment.json, failure images); default: <rootdir>/.ditgate",
)

CORE_OPTIONS = (ENABLE, TARGET, ARTEFACT_DIR)
