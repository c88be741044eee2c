"""Noise-aware comparison of two measurements: a ratio of medians with a confidence interval.

Only measurements taken on the same arch, driver and torch with the same timer and regime are
comparable; anything else is refused with a clear message instead of producing a misleading ratio.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pytest_ditgate.bench.measurement import Measurement
from pytest_ditgate.bench.stats import METHODS, ratio_interval
from pytest_ditgate.errors import DitgateUsageError

#: provenance fields that must be equal on both sides of a comparison
MUST_MATCH = ("arch", "driver", "torch", "mechanism", "regime", "l2_mode")


@dataclass(frozen=True)
class Comparison:
    """``a`` against ``b``: ``ratio`` = median(a) / median(b) (below 1: ``a`` is faster)."""

    a: Measurement
    b: Measurement
    ratio: float
    ci_low: float
    ci_high: float
    confidence: float
    method: str

    def faster_by_at_least(self, fraction: float) -> bool:
        """True when the whole interval says ``a`` takes at most ``1 - fraction`` of ``b``'s time."""
        return self.ci_high <= 1.0 - fraction

    def slower_by_at_least(self, fraction: float) -> bool:
        """True when the whole interval says ``a`` takes at least ``1 + fraction`` of ``b``'s time."""
        return self.ci_low >= 1.0 + fraction

    @property
    def significant(self) -> bool:
        """The interval excludes "no difference" (ratio 1)."""
        return self.ci_low > 1.0 or self.ci_high < 1.0

    def describe(self) -> str:
        pct = int(round(self.confidence * 100))
        return (f"{self.a.name} / {self.b.name} = {self.ratio:.4f} "
                f"({pct}% CI {self.ci_low:.4f}..{self.ci_high:.4f}, {self.method}, {self.a.mechanism})")

    def to_dict(self, *, samples: bool = True) -> dict[str, Any]:
        def side(m: Measurement) -> dict[str, Any]:
            data = m.to_dict()
            if not samples:
                data.pop("samples_ms")
            return data

        return {"a": side(self.a), "b": side(self.b), "ratio": self.ratio, "ci_low": self.ci_low,
                "ci_high": self.ci_high, "confidence": self.confidence, "method": self.method}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Comparison":
        return cls(a=Measurement.from_dict(data["a"]), b=Measurement.from_dict(data["b"]),
                   ratio=float(data["ratio"]), ci_low=float(data["ci_low"]), ci_high=float(data["ci_high"]),
                   confidence=float(data["confidence"]), method=str(data["method"]))


def check_comparable(a: Measurement, b: Measurement) -> None:
    """Raise DitgateUsageError naming every provenance field that differs."""
    differences = [f"{name}: {getattr(a, name)!r} vs {getattr(b, name)!r}"
                   for name in MUST_MATCH if getattr(a, name) != getattr(b, name)]
    if differences:
        raise DitgateUsageError(
            f"refusing to compare {a.name!r} with {b.name!r}: they were measured under different conditions "
            f"({'; '.join(differences)}). Measure both in the same run (ditbench.pair / measure_pair) "
            "and compare ratios, never absolute times from another device, driver, torch or timer.")


def compare(a: Measurement, b: Measurement, *, method: str = "bootstrap", confidence: float = 0.95) -> Comparison:
    """Ratio of medians ``a / b`` with a ``confidence`` interval by ``method`` (see ``stats.METHODS``)."""
    if method not in METHODS:
        raise DitgateUsageError(f"method={method!r}: choose from {', '.join(METHODS)}")
    for name, side in (("a", a), ("b", b)):
        if not isinstance(side, Measurement):
            from pytest_ditgate.arguments import describe

            raise DitgateUsageError(f"compare(a, b): {name} must be a Measurement (from measure or ditbench), got "
                                    f"{describe(side)}")
    check_comparable(a, b)
    if method == "paired-bootstrap" and a.n != b.n:
        raise DitgateUsageError(f"paired-bootstrap needs samples taken in rounds (n={a.n} vs n={b.n})")
    try:
        interval = ratio_interval(a.samples_ms, b.samples_ms, method=method, confidence=confidence)
    except ValueError as exc:
        raise DitgateUsageError(f"cannot compare {a.name!r} with {b.name!r}: {exc}") from None
    return Comparison(a=a, b=b, ratio=interval.ratio, ci_low=interval.low, ci_high=interval.high,
                      confidence=interval.confidence, method=interval.method)
