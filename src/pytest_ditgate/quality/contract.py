"""The quality contract: which metrics each experiment class must meet, with what limits. Torch-free.

A TOML file (``fixtures/quality_contract.toml`` by default)::

    [images]
    range = [0.0, 1.0]     # value range of image tensors (or [-1.0, 1.0])
    tile = 16              # tile size in px of the worst-tile error map

    [metrics.psnr]
    direction = "higher"   # optional; checked against the metric's own direction
    required = true        # default for the class tables below (a required metric that cannot be
                           # computed fails; an optional one is skipped with the reason)
    [metrics.psnr.numerical]
    min = { bf16 = 28.0, fp16 = 32.0, fp32 = 50.0 }   # a number, or a table keyed by compute dtype
    [metrics.clip_score]
    min = 20.0             # a floor: checked on the baseline too (the pass/fail transition table)
    [metrics.clip_score.quantization]   # zero regression: candidate >= baseline
    [metrics.class_accuracy]
    cases = ["shapes-*"]   # the cases this metric judges (fnmatch; "!pattern" excludes; default: all;
                           # a class table may name its own)
    [metrics."psnr@shapes"]  # a second psnr table, with other limits for other cases (mind that no
    cases = ["shapes-*"]     # case is judged by two tables of one metric)
    noise = 0.02           # measured seed-to-seed spread: the only regression quantization may show
    [structural]           # cases whose outputs carry no meaning under a class's change (random weights
    approximate = ["!shapes-*"]  # sample noise; fewer steps give other noise): judged on shapes and finiteness

``[structural]`` names, per experiment class, the cases (patterns as ``cases``) where a candidate of that
class is judged on its tensors' shapes, finiteness and image range only, with no metric: the result says
so (``QualityResult.structural``), and what a metric cannot judge there (determinism) is the gate suite's.
A metric takes part in a class only when it has a table for that class. Limits: ``min``/``max`` bound
the value (pair metrics compare candidate with baseline, so the bound is on their distance);
``abs``/``rel`` bound the regression of a *score* metric from the baseline's value. ``quantization``
allows no regression on any score metric beyond its measured seed ``noise``. Every unknown metric,
class or key is a usage error naming the file and the key.
"""

from __future__ import annotations

import fnmatch
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from pytest_ditgate.dtypes import CONTRACT_KEYS
from pytest_ditgate.errors import DitgateUsageError
from pytest_ditgate.quality.specs import (DEFAULT_DTYPE_KEY, EXPERIMENT_CLASSES, HIGHER, KINDS, LOWER,
                                          METRICS, MetricSpec)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_CONTRACT_PATH = "fixtures/quality_contract.toml"
#: the contract shipped inside the package, used when the project has none (documented field by field)
PACKAGED_CONTRACT = "default_contract.toml"


def packaged_contract_path() -> Path:
    """Where the shipped default contract is (a file inside the installed package)."""
    return Path(__file__).with_name(PACKAGED_CONTRACT)


def contract_path_for(root: Path, configured: str | None) -> Path:
    """The contract a project is judged by: the one it names, else its ``fixtures/quality_contract.toml``, else
    the packaged default. The one reading shared by the quality session and the judge, so both compare alike."""
    from pytest_ditgate.project_config import project_path

    if configured:
        return project_path(root, configured)
    default = root / DEFAULT_CONTRACT_PATH
    return default if default.exists() else packaged_contract_path()


TOP_KEYS = ("contract", "images", "metrics", "structural")
META_KEYS = ("version", "description")
IMAGE_KEYS = ("range", "tile")
METRIC_KEYS = ("direction", "required", "kinds", "cases", "noise", "min", "max", "note")
CLASS_KEYS = ("required", "cases", "min", "max", "abs", "rel", "note")
IMAGE_RANGES = ((0.0, 1.0), (-1.0, 1.0))
_LABEL = re.compile(r"^[A-Za-z0-9_-]+$")


class ContractError(DitgateUsageError):
    """A malformed quality contract; the message names the file and the key."""


def case_selected(patterns: tuple[str, ...], case: str) -> bool:
    """Whether ``case`` matches a pattern (or there is none) and no ``!pattern`` excludes it."""
    include = [p for p in patterns if not p.startswith("!")]
    exclude = [p[1:] for p in patterns if p.startswith("!")]
    if any(fnmatch.fnmatchcase(case, pattern) for pattern in exclude):
        return False
    return not include or any(fnmatch.fnmatchcase(case, pattern) for pattern in include)


@dataclass(frozen=True)
class Rule:
    """What one metric must meet under one experiment class."""

    metric: str
    experiment_class: str
    required: bool
    kinds: tuple[str, ...]
    min: Any = None  # float or {dtype: float}
    max: Any = None
    abs: Any = None
    rel: Any = None
    source: str = ""  # "file: metrics.<name>.<class>", for messages
    cases: tuple[str, ...] = ()  # fnmatch patterns of the cases judged ("!pattern" excludes); empty: every case
    noise: float | None = None  # score metrics: measured seed-to-seed spread (quantization's allowance)

    @property
    def spec(self) -> MetricSpec:
        return METRICS[self.metric]

    def applies_to(self, case: str) -> bool:
        """Whether this rule judges ``case``: it matches a pattern of ``cases`` (or there is none) and no
        ``!pattern`` excludes it."""
        return case_selected(self.cases, case)

    def limit(self, key: str, dtype_key: str | None) -> float | None:
        """The ``key`` limit (min, max, abs, rel) for ``dtype_key``; table limits fall back to ``default``."""
        value = getattr(self, key)
        if value is None or not isinstance(value, dict):
            return value
        if dtype_key in value:
            return value[dtype_key]
        if DEFAULT_DTYPE_KEY in value:
            return value[DEFAULT_DTYPE_KEY]
        raise ContractError(f"{self.source}.{key} has no limit for dtype {dtype_key!r} and no 'default' "
                            f"(it has {', '.join(sorted(value))})")


@dataclass(frozen=True)
class QualityContract:
    """A validated contract: rules per experiment class, plus image settings."""

    path: str
    rules_by_class: dict[str, tuple[Rule, ...]]
    image_range: tuple[float, float] = (0.0, 1.0)
    tile: int = 16
    #: experiment class -> patterns of the cases judged on structure only under it (``[structural]``)
    structural: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def structure_only(self, experiment_class: str, case: str) -> str | None:
        """Why ``case`` is judged on shapes and finiteness only under ``experiment_class`` (None: by metrics)."""
        patterns = self.structural.get(experiment_class)
        if patterns is None or not case_selected(patterns, case):
            return None
        return (f"judged on shapes and finiteness only: {self.path} [structural] says the outputs of case {case!r} "
                f"carry no meaning under class {experiment_class!r} (no metric judges them)")

    def rules(self, experiment_class: str) -> tuple[Rule, ...]:
        """The rules of ``experiment_class``; a class the contract has no rule for is an error, never
        "no rules" (which would pass every candidate)."""
        if experiment_class not in EXPERIMENT_CLASSES:
            raise ContractError(f"unknown experiment class {experiment_class!r}: choose from "
                                f"{', '.join(EXPERIMENT_CLASSES)}")
        rules = self.rules_by_class.get(experiment_class, ())
        if not rules:
            raise ContractError(f"quality contract {self.path} has no rule for experiment class "
                                f"{experiment_class!r} (it covers: {', '.join(self.covered()) or 'no class'}); add "
                                f"[metrics.<name>.{experiment_class}] tables or choose a covered class")
        return rules

    def covered(self) -> list[str]:
        """The experiment classes with at least one rule."""
        return [name for name in EXPERIMENT_CLASSES if self.rules_by_class.get(name)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path, "image_range": list(self.image_range), "tile": self.tile,
            "structural": {name: list(patterns) for name, patterns in self.structural.items()},
            "classes": {name: {rule.metric: {k: getattr(rule, k) for k in ("required", "min", "max", "abs", "rel",
                                                                           "noise", "cases")}
                               for rule in rules} for name, rules in self.rules_by_class.items()},
        }


def load_contract(path: str | Path, *, label: str | None = None) -> QualityContract:
    """Read and validate a contract file; any problem is a :class:`ContractError` naming file and key.

    ``label`` is how messages name the file (default: ``path`` as given).
    """
    source = label or str(path)
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ContractError(f"quality contract {source}: not UTF-8 text ({exc.reason} at byte {exc.start}); "
                            "save it as UTF-8") from None
    except FileNotFoundError:
        raise ContractError(f"quality contract {source} does not exist; create it (see "
                            f"{DEFAULT_CONTRACT_PATH} in pytest-ditgate's repository) or point "
                            f"--ditgate-contract / ini ditgate_contract at one") from None
    except OSError as exc:
        raise ContractError(f"quality contract {source}: cannot read ({exc})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ContractError(f"quality contract {source}: not valid TOML ({exc})") from None
    return contract_from_dict(data, source=source)


def contract_from_dict(data: Mapping[str, Any], *, source: str = "<contract>") -> QualityContract:
    """Validate a parsed contract (the TOML document as a dict)."""
    _unknown(data, TOP_KEYS, source, "")
    _unknown(_table(data, "contract", source), META_KEYS, source, "contract.")
    images = _table(data, "images", source)
    _unknown(images, IMAGE_KEYS, source, "images.")
    image_range = _image_range(images.get("range", [0.0, 1.0]), source)
    tile = images.get("tile", 16)
    if not isinstance(tile, int) or isinstance(tile, bool) or tile < 1:
        raise ContractError(f"{source}: images.tile must be a positive integer, got {tile!r}")
    metrics = _table(data, "metrics", source)
    if not metrics:
        raise ContractError(f"{source}: no [metrics.<name>] tables; a contract must name at least one metric")
    by_class: dict[str, list[Rule]] = {name: [] for name in EXPERIMENT_CLASSES}
    for key, table in metrics.items():
        where = f"metrics.{key}"
        name, at, label = key.partition("@")  # "psnr@shapes": a second table of psnr, for other cases
        if name not in METRICS or (at and not _LABEL.match(label)):
            raise ContractError(f"{source}: unknown metric {where!r}; known metrics: {', '.join(METRICS)} (a second "
                                f"table of a metric is named <metric>@<label>, e.g. psnr@shapes, with its own cases)")
        if not isinstance(table, dict):
            raise ContractError(f"{source}: {where} must be a table")
        spec = METRICS[name]
        _unknown(table, METRIC_KEYS + EXPERIMENT_CLASSES, source, where + ".",
                 hint=f"experiment classes are {', '.join(EXPERIMENT_CLASSES)}")
        direction = table.get("direction", spec.direction)
        if direction not in (HIGHER, LOWER):
            raise ContractError(f"{source}: {where}.direction must be 'higher' or 'lower', got {direction!r}")
        if direction != spec.direction:
            raise ContractError(f"{source}: {where}.direction = {direction!r}, but {name} is "
                                f"{spec.direction}-is-better")
        required = _bool(table.get("required", True), source, f"{where}.required")
        kinds = _kinds(table.get("kinds", list(spec.kinds)), spec, source, f"{where}.kinds")
        defaults = {key: _limit(table.get(key), spec, key, source, f"{where}.{key}") for key in ("min", "max")}
        cases = _cases(table.get("cases", []), source, f"{where}.cases")
        noise = _noise(table.get("noise"), spec, source, f"{where}.noise")
        for cls in EXPERIMENT_CLASSES:
            if cls not in table:
                continue
            sub = table[cls]
            here = f"{where}.{cls}"
            if not isinstance(sub, dict):
                raise ContractError(f"{source}: {here} must be a table (use {here} = {{}} for no limits)")
            _unknown(sub, CLASS_KEYS, source, here + ".")
            limits = {key: _limit(sub.get(key, defaults.get(key)), spec, key, source, f"{here}.{key}")
                      for key in ("min", "max", "abs", "rel")}
            rule_required = _bool(sub.get("required", required), source, f"{here}.required")
            if cls == "quantization" and not spec.pair:
                for key in ("abs", "rel"):
                    if limits[key] not in (None, 0, 0.0):
                        raise ContractError(f"{source}: {here}.{key} = {limits[key]!r}: the quantization class "
                                            f"allows no regression beyond the metric's measured seed noise "
                                            f"({where}.noise); remove the key or set it to 0")
                limits["abs"], limits["rel"] = 0.0, 0.0
            rule_cases = _cases(sub["cases"], source, f"{here}.cases") if "cases" in sub else cases
            by_class[cls].append(Rule(name, cls, rule_required, kinds, source=f"{source}: {here}", cases=rule_cases,
                                      noise=noise, **limits))
    structural = _table(data, "structural", source)
    _unknown(structural, EXPERIMENT_CLASSES, source, "structural.", hint="keys are experiment classes")
    return QualityContract(path=source, rules_by_class={k: tuple(v) for k, v in by_class.items()},
                           image_range=image_range, tile=tile,
                           structural={cls: _cases(patterns, source, f"structural.{cls}")
                                       for cls, patterns in structural.items()})


def _table(data: Mapping[str, Any], key: str, source: str) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise ContractError(f"{source}: {key} must be a table")
    return value


def _unknown(table: Mapping[str, Any], allowed: tuple[str, ...], source: str, prefix: str, hint: str = "") -> None:
    for key in table:
        if key not in allowed:
            extra = f"; {hint}" if hint else ""
            raise ContractError(f"{source}: unknown key {prefix}{key!r} (allowed: {', '.join(allowed)}){extra}")


def _bool(value: Any, source: str, where: str) -> bool:
    if not isinstance(value, bool):
        raise ContractError(f"{source}: {where} must be true or false, got {value!r}")
    return value


def _kinds(value: Any, spec: MetricSpec, source: str, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ContractError(f"{source}: {where} must be a non-empty list of kinds ({', '.join(KINDS)})")
    for kind in value:
        if kind not in spec.kinds:
            raise ContractError(f"{source}: {where}: {spec.name} does not apply to {kind!r} tensors "
                                f"(it applies to {', '.join(spec.kinds)})")
    return tuple(value)


def _cases(value: Any, source: str, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.lstrip("!") for v in value):
        raise ContractError(f"{source}: {where} must be a list of case-name patterns (fnmatch, e.g. \"shapes-*\"; "
                            f"\"!shapes-*\" excludes), got {value!r}")
    return tuple(value)


def _noise(value: Any, spec: MetricSpec, source: str, where: str) -> float | None:
    if value is None:
        return None
    if spec.pair:
        raise ContractError(f"{source}: {where}: {spec.name} compares candidate with baseline; a seed noise "
                            "applies to score metrics only")
    return _checked(_number(value, source, where), "abs", source, where)  # finite and >= 0, like abs


def _number(value: Any, source: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ContractError(f"{source}: {where} must be a number, got {value!r}")
    return float(value)


def _limit(value: Any, spec: MetricSpec, key: str, source: str, where: str) -> Any:
    if value is None:
        return None
    if key == "min" and spec.direction == LOWER:
        raise ContractError(f"{source}: {where}: {spec.name} is lower-is-better; bound it with max")
    if key == "max" and spec.direction == HIGHER:
        raise ContractError(f"{source}: {where}: {spec.name} is higher-is-better; bound it with min")
    if key in ("abs", "rel") and spec.pair:
        raise ContractError(f"{source}: {where}: {spec.name} already compares candidate with baseline "
                            f"(regression limits abs/rel are for score metrics); bound it with "
                            f"{'min' if spec.direction == HIGHER else 'max'}")
    if isinstance(value, dict):
        if not value:
            raise ContractError(f"{source}: {where} is an empty dtype table")
        out = {}
        for dtype, item in value.items():
            if dtype not in CONTRACT_KEYS + (DEFAULT_DTYPE_KEY,):
                raise ContractError(f"{source}: {where}: unknown dtype key {dtype!r} "
                                    f"(allowed: {', '.join(CONTRACT_KEYS + (DEFAULT_DTYPE_KEY,))})")
            out[dtype] = _checked(_number(item, source, f"{where}.{dtype}"), key, source, f"{where}.{dtype}")
        return out
    return _checked(_number(value, source, where), key, source, where)


def _checked(value: float, key: str, source: str, where: str) -> float:
    """A limit must be finite (``inf`` would switch the bound off); regression limits are also >= 0."""
    if math.isinf(value):
        raise ContractError(f"{source}: {where} must be a finite number, got {value!r} (an infinite bound "
                            "checks nothing; remove the key or the class table instead)")
    if key in ("abs", "rel") and value < 0:
        raise ContractError(f"{source}: {where} must be a finite number >= 0, got {value!r}")
    return value


def _image_range(value: Any, source: str) -> tuple[float, float]:
    try:
        pair = (float(value[0]), float(value[1]))
    except (TypeError, ValueError, IndexError, KeyError):
        pair = None
    if pair is None or len(value) != 2 or pair not in IMAGE_RANGES:
        raise ContractError(f"{source}: images.range must be [0.0, 1.0] or [-1.0, 1.0], got {value!r}")
    return pair
