"""A lane's timing module whose REGIONS repeat a name is refused (12) naming it: the judge times and records
regions by name, so the second silently replaced the first and one region went untimed."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_ditgate.experiment import rounds

MODULE = """
from pytest_ditgate.timed_region import TimedRegion

def _build(impl):
    return lambda x: x

REGIONS = [TimedRegion("forward", _build, lambda g: ()), TimedRegion("{second}", _build, lambda g: ())]
"""


def test_two_regions_of_one_name_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "lane_timing.py"
    path.write_text(MODULE.format(second="forward"))
    with pytest.raises(rounds.Refusal, match="more than one region named 'forward'"):
        rounds.load_specs(path, tmp_path / "project")


def test_regions_of_their_own_names_load(tmp_path: Path) -> None:
    path = tmp_path / "lane_timing.py"
    path.write_text(MODULE.format(second="sampling"))
    assert list(rounds.load_specs(path, tmp_path / "project")) == ["forward", "sampling"]
