"""Project-level wiring of the bundled gate suites.

This repository's own workloads (``kernels/``, ``dit_impl/``) are importable from the repository root
because pytest puts this folder on ``sys.path`` for this conftest. Workload fixtures live beside their
suites (``tests/gates/<workload>/conftest.py``); settings shared by every suite live here.
"""

from __future__ import annotations

import os

try:  # hypothesis is a test dependency; keep CI deterministic and bounded in time
    from hypothesis import HealthCheck, settings

    settings.register_profile("ci", derandomize=True, deadline=None, max_examples=25,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.register_profile("dev", deadline=None, max_examples=50)
    settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))
except ImportError:  # pragma: no cover
    pass
