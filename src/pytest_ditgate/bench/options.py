"""Options of the ditgate benchmark recorder (light: imported at every pytest start to declare them)."""

from __future__ import annotations

from pytest_ditgate.bench.l2 import L2_MODES
from pytest_ditgate.bench.mechanisms import MECHANISMS
from pytest_ditgate.options import OptionSpec, positive_float

MECHANISM = OptionSpec("--ditgate-bench-mechanism", "timing mechanism for ditbench (default: auto)",
                       default="auto", choices=("auto", *MECHANISMS))
BUDGET = OptionSpec("--ditgate-bench-budget-ms", "sampling time per ditbench measurement in ms (default 100)",
                    parse=positive_float)
L2 = OptionSpec("--ditgate-bench-l2", "L2 state for ditbench measurements: warm or cold (default warm)",
                default="warm", choices=L2_MODES)
PROFILE = OptionSpec("--ditgate-profile", "after each ditbench measurement, trace the call once more and record "
                     "its phase profile (GEMM, attention, norm/elementwise, copies, idle gaps), top kernels and a "
                     "Chrome/Perfetto trace under <ditgate-dir>/profiles/", kind="bool")
#: the experiment lane of this run: the ledger files every measurement (and a lane's best) under it; the
#: verdict (``--ditgate-lane`` of an advisory run) judges that lane
LANE = OptionSpec("--ditgate-lane", "experiment lane of an advisory verdict in this process (only `ditgate "
                  "experiment` judges and records a lane's KEEP)")
OPTIONS = (MECHANISM, BUDGET, L2, PROFILE, LANE)
