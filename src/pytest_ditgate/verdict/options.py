"""Options of experiment mode (light: imported at every pytest start to declare them). The lane
(``--ditgate-lane``) is the timing concern's option (``bench/options.py``): every measurement is filed under it.
"""

from __future__ import annotations

from pytest_ditgate.options import OptionSpec, noise_floor_text

VERDICT_JSON = OptionSpec("--ditgate-verdict-json", "write the machine-readable verdict to this file")
DESCRIPTION = OptionSpec("--ditgate-description", "one line describing the candidate's causal hypothesis "
                         "(goes into results.tsv)")
MIN_IMPROVEMENT = OptionSpec("--ditgate-min-improvement", "fraction by which the candidate must beat the lane "
                             "best (on the CI bound) to be kept; default: the lane's min_improvement "
                             "([tool.ditgate.lanes.<lane>], 0.02 when not set)", parse=noise_floor_text, default=None)
OPTIONS = (VERDICT_JSON, DESCRIPTION, MIN_IMPROVEMENT)
