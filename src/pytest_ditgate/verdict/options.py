"""Options of experiment mode (light: imported at every pytest start to declare them)."""

from __future__ import annotations

from pytest_ditgate.options import OptionSpec

LANE = OptionSpec("--ditgate-lane", "experiment lane: judge this run as a candidate in that lane (speed vs the "
                  "lane's best, quality vs the frozen baseline) and append it to the ledger")
VERDICT_JSON = OptionSpec("--ditgate-verdict-json", "write the machine-readable verdict to this file")
DESCRIPTION = OptionSpec("--ditgate-description", "one line describing the candidate's causal hypothesis "
                         "(goes into results.tsv)")
BASE = OptionSpec("--ditgate-base", "git revision the candidate is compared with for the scope check "
                  "(default: HEAD^)")
MIN_IMPROVEMENT = OptionSpec("--ditgate-min-improvement", "fraction by which the candidate must beat the lane "
                             "best (on the CI bound) to be kept; default 0", parse=float, default=0.0)
OPTIONS = (LANE, VERDICT_JSON, DESCRIPTION, BASE, MIN_IMPROVEMENT)
