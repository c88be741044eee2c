"""A lane: what ``[tool.ditgate.lanes.<name>]`` declares (:func:`load_lane`), and ``ditgate_lane``, what a gate
suite needs to re-measure the lane's best against the candidate. The judge (``ditgate experiment``) and the
advisory verdict (``--ditgate-lane``) read a lane through this module alike.

```toml
[tool.ditgate.lanes.fwd]
tests = ["tests/gates/test_gate.py"]   # the only tests the judge runs (paths or node ids)
class = "exact"                        # the class assumed when the experiment declares none
objective = "time_ratio"               # candidate time / baseline time, measured side by side
required = ["*test_quality*"]          # node-id globs that must produce a judged output or comparison
min_improvement = 0.02                 # a new best must beat the re-measured best by this fraction (CI bound)
timing = "tests/gates/lane_timing.py"  # the regions the judge times itself (pytest_ditgate.timed_region)
```

With ``timing``, the judge times the lane in processes of its own, on its own clock (docs/agent_loop.md, "How
the judge times"); the lane's tests then check quality only, and a test that times in the candidate's process
(``ditbench``) is left out of a judged run. Without it, a lane's speed comes from its tests' ``ditbench.pair``
samples, taken in the candidate's process: advisory, and a verdict says so.

``min_improvement`` is the lane's noise floor. Two runs of the same code, measured side by side, can
differ by a percent or two in one direction: the host clock drifts after a heavy run, and order effects
favour one side: an empty commit can measure 0.983 against the re-measured best, with a CI of 0.970 to
0.995. The default, 2 %, keeps such a run from becoming the best. Lower it for a lane timed
with CUDA events on a quiet machine; never below 0.

A lane best recorded from one lucky run would make every later candidate look slow (the winner's curse).
So a suite that can rebuild the best from its recorded configuration measures it side by side with the
candidate in the same run: ``ditgate_lane.record_config({...})`` stores how to rebuild this candidate
(kept with the best on KEEP), ``ditgate_lane.best_config`` gives the best's, and a
``ditbench.pair(candidate, best, ..., labels=("candidate", LANE_BEST_LABEL))`` comparison then decides
the speed verdict directly (its CI bound), instead of the ratio recorded on another day.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import pytest

from pytest_ditgate import options
from pytest_ditgate.project_config import noise_floor
from pytest_ditgate.context import get_context
from pytest_ditgate.errors import DitgateUsageError
from pytest_ditgate.quality.specs import DEFAULT_CLASS, EXPERIMENT_CLASSES
from pytest_ditgate.report_properties import CONFIG_PROPERTY
from pytest_ditgate.verdict.objective import LANE_BEST_LABEL

__all__ = ["CONFIG_PROPERTY", "DEFAULT_MIN_IMPROVEMENT", "LANE_BEST_LABEL", "LaneHandle", "LaneSpec", "ditgate_lane",
           "load_lane"]

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
    #: the lane's timing module (relative to the project root), or None
    timing: str | None = None


def _strings(table: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise DitgateUsageError(f"{where} {key} must be a list of non-empty strings, got {value!r}")
    return tuple(value)


def load_lane(project: Mapping[str, Any], name: str) -> LaneSpec:
    """The lane ``name`` of the ``[tool.ditgate]`` table, validated."""
    from pytest_ditgate.arguments import did_you_mean
    from pytest_ditgate.project_config import LANE_KEYS

    lanes = project.get("lanes", {})
    if not isinstance(lanes, dict) or name not in lanes or not isinstance(lanes[name], dict):
        declared = sorted(lanes) if isinstance(lanes, dict) else []
        raise DitgateUsageError(f"lane {name!r} is not declared in [tool.ditgate.lanes]{did_you_mean(name, declared)} "
                                f"(declared: {', '.join(declared) or 'none'})")
    table = lanes[name]
    where = f"[tool.ditgate.lanes.{name}]"
    unknown = sorted(set(table) - set(LANE_KEYS))
    if unknown:
        raise DitgateUsageError(f"{where}: unknown key {unknown[0]!r}{did_you_mean(unknown[0], LANE_KEYS)} "
                                f"(known: {', '.join(LANE_KEYS)})")
    tests = _strings(table, "tests", where)
    if not tests:
        raise DitgateUsageError(f"{where} tests must name at least one test path")
    cls = table.get("class", DEFAULT_CLASS)
    if cls not in EXPERIMENT_CLASSES:
        raise DitgateUsageError(f"{where} class must be one of {', '.join(EXPERIMENT_CLASSES)}, got {cls!r}")
    objective = table.get("objective", "time_ratio")
    if objective not in OBJECTIVES:
        raise DitgateUsageError(f"{where} objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    floor = table.get("min_improvement", DEFAULT_MIN_IMPROVEMENT)
    try:
        floor = noise_floor(floor)
    except ValueError as exc:
        raise DitgateUsageError(f"{where} min_improvement {exc}") from None
    timing = table.get("timing")
    if timing is not None and (not isinstance(timing, str) or not timing.endswith(".py")):
        raise DitgateUsageError(f"{where} timing must name a Python file of the project (the lane's timed "
                                f"regions), got {timing!r}")
    return LaneSpec(name, tests, cls, objective, _strings(table, "required", where), floor, timing)


def check_lanes(root: Any, project: Mapping[str, Any], lane: str | None) -> None:
    """Every declared lane, validated, with its test files present; and ``lane`` (``--ditgate-lane``), when given,
    one of them: a typo'd lane would otherwise have no best and read as a first KEEP. DitgateUsageError on the
    first problem."""
    from pytest_ditgate.project_config import missing_paths

    lanes = project.get("lanes") or {}
    for name in lanes:
        spec = load_lane(project, name)
        missing = missing_paths(root, list(spec.tests), f"[tool.ditgate.lanes.{name}] tests")
        if spec.timing is not None:
            missing += missing_paths(root, [spec.timing], f"[tool.ditgate.lanes.{name}] timing")
        if missing:
            raise DitgateUsageError(missing[0])
    if lane is not None:
        load_lane(project, lane)


def pytest_configure(config: pytest.Config) -> None:
    """The lanes are settings: checked when the run starts (exit 4 naming the problem), not when first used."""
    from pytest_ditgate.bench.options import LANE
    from pytest_ditgate.project_config import load_project_config

    lane = options.get_option(config, LANE)
    try:
        check_lanes(config.rootpath, load_project_config(config.rootpath), lane)
    except DitgateUsageError as exc:
        flag = f"--ditgate-lane={lane}: " if lane and str(exc).startswith(f"lane {lane!r}") else ""
        raise pytest.UsageError(flag + str(exc)) from None


@dataclass(repr=False)
class LaneHandle:
    name: str | None
    arch: str
    best: dict[str, Any] | None
    item: pytest.Item | None = None

    def __repr__(self) -> str:  # pytest prints the fixture beside a failing test: keep it one short line
        return f"<ditgate_lane fixture: lane {self.name}, {self.arch}, {'a best' if self.best else 'no best'} recorded>"

    @property
    def best_config(self) -> dict[str, Any] | None:
        """How to rebuild the lane's best (None: no best yet, or it recorded no configuration)."""
        return (self.best or {}).get("candidate_config")

    def record_config(self, config: dict[str, Any]) -> None:
        """Record how to rebuild this candidate (JSON-serialisable); kept with the best on KEEP."""
        if self.item is not None:
            self.item.user_properties.append((CONFIG_PROPERTY, dict(config)))


@pytest.fixture
def ditgate_lane(request: pytest.FixtureRequest) -> LaneHandle:
    """The experiment lane of this run (``--ditgate-lane``) and its recorded best on this device's arch."""
    from pytest_ditgate.bench.options import LANE
    from pytest_ditgate.device import real_device
    from pytest_ditgate.judged_run import in_judged_run, lane_best_config

    lane = options.get_option(request.config, LANE)
    arch = real_device().arch
    best = lane_best_config() if lane else None  # handed over by the judge, from the history
    if lane and best is None and not in_judged_run():
        from pytest_ditgate.verdict.ledger import load_best

        try:  # an advisory run: the best the judge last mirrored
            best = load_best(get_context(request.config).artefact_dir, lane, arch)
        except ValueError as exc:
            pytest.fail(str(exc), pytrace=False)
    return LaneHandle(lane, arch, best, request.node)
