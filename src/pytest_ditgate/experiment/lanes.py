"""``[tool.ditgate.lanes.<name>]``: what a lane's judged run is, fixed by the project, never by the caller.

```toml
[tool.ditgate.lanes.fwd]
tests = ["tests/gates/test_gate.py"]   # the only tests the judge runs (paths or node ids)
class = "exact"                        # the class assumed when the experiment declares none
objective = "time_ratio"               # candidate time / baseline time, measured side by side
required = ["*test_quality*"]          # node-id globs that must produce a judged output or comparison
min_improvement = 0.02                 # a new best must beat the re-measured best by this fraction (CI bound)
```

``min_improvement`` is the lane's noise floor. Two runs of the same code, measured side by side, can
differ by a percent or two in one direction: the host clock drifts after a heavy run, and order effects
favour one side: an empty commit can measure 0.983 against the re-measured best, with a CI of 0.970 to
0.995. The default, 2 %, keeps such a run from becoming the best. Lower it for a lane timed
with CUDA events on a quiet machine; never below 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from pytest_ditgate.errors import DitgateUsageError

OBJECTIVES = ("time_ratio",)
#: a candidate must beat the re-measured lane best by this fraction (on the CI's upper bound) to be kept
DEFAULT_MIN_IMPROVEMENT = 0.02


@dataclass(frozen=True)
class LaneSpec:
    name: str
    tests: tuple[str, ...]
    default_class: str
    objective: str = "time_ratio"
    required: tuple[str, ...] = ()
    min_improvement: float = DEFAULT_MIN_IMPROVEMENT


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
    unknown = set(table) - {"tests", "class", "objective", "required", "min_improvement"}
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
    floor = table.get("min_improvement", DEFAULT_MIN_IMPROVEMENT)
    if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not 0.0 <= floor < 0.5:
        raise DitgateUsageError(f"{where} min_improvement must be a number in [0, 0.5), got {floor!r}")
    return LaneSpec(name, tests, cls, objective, _strings(table, "required", where), float(floor))
