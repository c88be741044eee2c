"""``ditgate_lane``: what a gate suite needs to re-measure the lane's best against the candidate.

A lane best recorded from one lucky run would make every later candidate look slow (the winner's curse).
So a suite that can rebuild the best from its recorded configuration measures it side by side with the
candidate in the same run: ``ditgate_lane.record_config({...})`` stores how to rebuild this candidate
(kept with the best on KEEP), ``ditgate_lane.best_config`` gives the best's, and a
``ditbench.pair(candidate, best, ..., labels=("candidate", LANE_BEST_LABEL))`` comparison then decides
the speed verdict directly (its CI bound), instead of the ratio recorded on another day.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from pytest_ditgate import options
from pytest_ditgate.context import get_context
from pytest_ditgate.report_properties import CONFIG_PROPERTY

#: the label that marks a ditbench.pair comparison as candidate versus the re-measured lane best
LANE_BEST_LABEL = "lane-best"

__all__ = ["CONFIG_PROPERTY", "LANE_BEST_LABEL", "LaneHandle", "ditgate_lane"]


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
    from pytest_ditgate.device import real_device
    from pytest_ditgate.experiment.child import in_judged_run, lane_best_config
    from pytest_ditgate.verdict.options import LANE

    lane = options.get_option(request.config, LANE)
    arch = real_device().arch
    best = lane_best_config(request.config) if lane else None  # handed over by the judge, from the history
    if lane and best is None and not in_judged_run():
        from pytest_ditgate.verdict.ledger import load_best

        try:  # an advisory run: the best the judge last mirrored
            best = load_best(get_context(request.config).artefact_dir, lane, arch)
        except ValueError as exc:
            pytest.fail(str(exc), pytrace=False)
    return LaneHandle(lane, arch, best, request.node)
