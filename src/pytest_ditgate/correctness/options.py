"""Options of the correctness gate (light: imported at every pytest start to declare them)."""

from __future__ import annotations

from pytest_ditgate import options

TRIALS = options.OptionSpec("--ditgate-kernel-trials",
                            "default number of trials (fresh seeded inputs) per kernel_check call; "
                            "an explicit trials= in the test wins", parse=options.positive_int)
SEED = options.OptionSpec("--ditgate-kernel-seed",
                          "default first seed of kernel_check calls (e.g. to explore new inputs in a nightly run); "
                          "an explicit seed= in the test wins", parse=int)
OPTIONS = (TRIALS, SEED)
