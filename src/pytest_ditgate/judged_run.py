"""The handover between the judge (``ditgate experiment`` / ``ditgate baseline``) and its child pytest run.

The judge makes a fresh folder, names it in ``$DITGATE_CHILD_OUT`` and starts the child run; the child's
recorder (``experiment/child.py``) writes what it saw there, and the judge reads it back
(``experiment/evidence.py``). The advisory verdict (``verdict/``) asks only whether this process is such a
child and which lane best the judge handed over. Standard library only: the judge, the recorder and the
verdict all import it, so the verdict never imports the judge to learn a name (as
``report_properties.py`` does for what the plugins pass through test reports).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

#: names the child's fresh output folder; set only in the judge's child run
OUT_ENV = "DITGATE_CHILD_OUT"
#: in that folder: every tensor set the child passed to ``golden.check``
OUTPUTS = "outputs.jsonl"
#: each test's phases and outcomes
TESTS = "tests.jsonl"
#: what executed, and what ``ditgate_candidate.declare`` reported
CLASS = "class.json"
#: the lane best the judge hands to the child (written by the judge before the child starts)
LANE_BEST = "lane_best.json"
#: set by the judge when it times the lane itself: the child leaves out the tests that time (``ditbench``)
JUDGE_TIMES_ENV = "DITGATE_JUDGE_TIMES"
#: in the child's folder: the node ids it left out for that reason
TIMED_BY_JUDGE = "timed_by_judge.json"


def in_judged_run() -> bool:
    """Whether this process is the child run of ``ditgate experiment`` / ``ditgate baseline``."""
    return bool(os.environ.get(OUT_ENV))


def lane_best_config() -> dict[str, Any] | None:
    """The lane best the judge handed to this child (None outside a judged run or without a best)."""
    out = os.environ.get(OUT_ENV)
    if not out:
        return None
    try:
        return json.loads((Path(out) / LANE_BEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
