"""``[tool.ditgate.lanes.<name>]``: what a lane's judged run is, fixed by the project, never by the caller.

```toml
[tool.ditgate.lanes.fwd]
tests = ["tests/gates/test_gate.py"]   # the only tests the judge runs (paths or node ids)
class = "exact"                        # the class assumed when the experiment declares none
objective = "time_ratio"               # candidate time / baseline time, measured side by side
required = ["*test_quality*"]          # node-id globs that must produce a judged output or comparison
```
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from pytest_ditgate.errors import DitgateUsageError

OBJECTIVES = ("time_ratio",)


@dataclass(frozen=True)
class LaneSpec:
    name: str
    tests: tuple[str, ...]
    default_class: str
    objective: str = "time_ratio"
    required: tuple[str, ...] = ()


def _strings(table: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise DitgateUsageError(f"{where} {key} must be a list of non-empty strings, got {value!r}")
    return tuple(value)


def load_lane(project: Mapping[str, Any], name: str) -> LaneSpec:
    """The lane ``name`` of the ``[tool.ditgate]`` table, validated."""
    from pytest_ditgate.quality.specs import EXPERIMENT_CLASSES

    lanes = project.get("lanes", {})
    if not isinstance(lanes, dict) or name not in lanes or not isinstance(lanes[name], dict):
        known = ", ".join(sorted(lanes)) if isinstance(lanes, dict) else "none"
        raise DitgateUsageError(f"lane {name!r} is not declared in [tool.ditgate.lanes] (declared: {known or 'none'})")
    table = lanes[name]
    where = f"[tool.ditgate.lanes.{name}]"
    unknown = set(table) - {"tests", "class", "objective", "required"}
    if unknown:
        raise DitgateUsageError(f"{where}: unknown keys {sorted(unknown)}")
    tests = _strings(table, "tests", where)
    if not tests:
        raise DitgateUsageError(f"{where} tests must name at least one test path")
    cls = table.get("class", "numerical")
    if cls not in EXPERIMENT_CLASSES:
        raise DitgateUsageError(f"{where} class must be one of {', '.join(EXPERIMENT_CLASSES)}, got {cls!r}")
    objective = table.get("objective", "time_ratio")
    if objective not in OBJECTIVES:
        raise DitgateUsageError(f"{where} objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    return LaneSpec(name, tests, cls, objective, _strings(table, "required", where))
