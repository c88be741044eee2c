"""Hand a ditgate Measurement to pytest-benchmark so that its table, ``--benchmark-json``, storage and
``compare`` keep working, with our provenance in ``extra_info``.

Only public pytest-benchmark API is used: the ``benchmark`` marker's ``timer`` option and
``benchmark.pedantic``. The timer is a *replay clock*: pedantic reads it once before and once after each
round, and it answers so that each round lasts exactly one of our device-time samples. pytest-benchmark
then computes its statistics from our samples, and its JSON names the timer ``ditgate.<mechanism>``.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_ditgate.bench.comparison import Comparison
from pytest_ditgate.bench.measurement import Measurement


class ReplayClock:
    """A clock whose successive (start, end) readings are 0 and one recorded sample, in seconds."""

    def __init__(self, samples_ms: tuple[float, ...], mechanism: str) -> None:
        self._samples = [s / 1e3 for s in samples_ms]
        self._reads = 0
        self.__name__ = f"ditgate.{mechanism}"

    def __call__(self) -> float:
        index, is_end = divmod(self._reads, 2)
        self._reads += 1
        if not is_end:
            return 0.0
        return self._samples[index % len(self._samples)]

    def __repr__(self) -> str:
        return self.__name__


def extra_info(m: Measurement) -> dict[str, Any]:
    """Our provenance, flat enough for pytest-benchmark's tables and storage."""
    return {
        "ditgate": True,
        "ditgate_mechanism": m.mechanism,
        "ditgate_regime": m.regime,
        "ditgate_l2": m.l2_mode,
        "ditgate_device": m.device,
        "ditgate_arch": m.arch,
        "ditgate_driver": m.driver,
        "ditgate_cuda": m.cuda,
        "ditgate_torch": m.torch,
        "ditgate_backend": m.backend,
        "ditgate_dtype": m.dtype,
        "ditgate_shapes": m.shapes,
        "ditgate_label": m.label,
        "ditgate_calls_per_sample": m.calls_per_sample,
        "ditgate_median_ms": m.median_ms,
        "ditgate_cv": m.cv,
        "ditgate_clocks_start": m.clocks_start,
        "ditgate_clocks_end": m.clocks_end,
    }


def pair_info(c: Comparison, min_speedup: float | None, passed: bool | None) -> dict[str, Any]:
    """What a ``ditbench.pair`` adds to the candidate's ``extra_info``: reference, ratio and its interval."""
    return {
        "ditgate_pair": True,
        "ditgate_pair_reference": c.b.name,
        "ditgate_pair_reference_median_ms": c.b.median_ms,
        "ditgate_pair_ratio": c.ratio,
        "ditgate_pair_ci_low": c.ci_low,
        "ditgate_pair_ci_high": c.ci_high,
        "ditgate_pair_confidence": c.confidence,
        "ditgate_pair_method": c.method,
        "ditgate_pair_min_speedup": min_speedup,
        "ditgate_pair_passed": passed,
    }


def feed_measurement(request: pytest.FixtureRequest, m: Measurement, extra: dict[str, Any] | None = None) -> None:
    """Record ``m`` as this test's pytest-benchmark result (the fixture is used once, on the first call);
    ``extra`` (a pair's :func:`pair_info`) joins our provenance in ``extra_info``."""
    node = request.node
    existing = node.get_closest_marker("benchmark")
    kwargs = dict(existing.kwargs) if existing else {}
    kwargs["timer"] = ReplayClock(m.samples_ms, m.mechanism)
    kwargs.setdefault("group", "ditgate")
    node.add_marker(pytest.mark.benchmark(**kwargs), append=False)
    benchmark = request.getfixturevalue("benchmark")
    benchmark.extra_info.update(extra_info(m))
    benchmark.extra_info.update(extra or {})
    benchmark.pedantic(lambda: None, rounds=len(m.samples_ms), iterations=1, warmup_rounds=0)
