"""Noise-aware comparison of two measurements: a ratio of medians with a confidence interval.

Only measurements taken on the same arch, driver and torch with the same timer and regime are
comparable; anything else is refused with a clear message instead of producing a misleading ratio.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pytest_ditgate.bench.measurement import Measurement
from pytest_ditgate.bench.mechanisms import BY_NAME, LATENCY, counts
from pytest_ditgate.bench.stats import METHODS, ratio_interval
from pytest_ditgate.errors import DitgateUsageError
from pytest_ditgate.timer_integrity import watch

#: provenance fields that must be equal on both sides of a comparison
MUST_MATCH = ("arch", "driver", "torch", "mechanism", "regime", "l2_mode")
#: a side whose device sat idle more than this fraction of its latency is named in the verdict line
IDLE_NOTE = 0.05


def notable(extra: dict[str, Any]) -> bool:
    """The device sat idle more than IDLE_NOTE of the latency, or the call synchronised with the host."""
    idle, syncs = extra.get("idle_fraction"), extra.get("host_syncs")
    return (isinstance(idle, (int, float)) and idle > IDLE_NOTE) or (isinstance(syncs, int) and syncs > 0)


def idle_line(extra: dict[str, Any]) -> str:
    """``23 % idle, host syncs: 2`` from a measurement's extra (what of it is known); a call that ran no
    device work at all (busy time 0: it runs on the host) says so instead of "100% idle"."""
    idle, syncs = extra.get("idle_fraction"), extra.get("host_syncs")
    if extra.get("busy_median_ms") == 0 and isinstance(idle, (int, float)) and idle >= 1.0:
        return "no device work (it runs on the host)"
    parts = [f"{idle:.0%} idle"] if isinstance(idle, (int, float)) else []
    parts += [f"host syncs: {syncs}"] if isinstance(syncs, int) else []
    return ", ".join(parts)


def timer_label(mechanism: str) -> str:
    """A mechanism's name as a verdict line shows it: ``cupti: kernel time only`` for a busy-time mechanism."""
    found = BY_NAME.get(mechanism)
    return mechanism if found is None or found.counts == LATENCY else f"{mechanism}: kernel time only"


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
    #: what ``ditbench.pair`` checked besides the times: ``outputs`` ("outputs agree", or why they were not
    #: compared), ``audited_calls`` (the candidate's timed calls audited), ``inputs`` (how each call's were made)
    checks: dict[str, Any] = field(default_factory=dict)

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
                f"({pct}% CI {self.ci_low:.4f}..{self.ci_high:.4f}, {self.method}, {timer_label(self.a.mechanism)})"
                + self.idle_text())

    def check_text(self) -> str:
        """``outputs not compared (...)`` when the pair compared no outputs (empty otherwise, and for a
        comparison that is not a ``ditbench.pair``'s)."""
        outputs = self.checks.get("outputs")
        return "" if outputs in (None, "outputs agree") else f"outputs {outputs.replace('outputs ', '', 1)}"

    def idle_text(self) -> str:
        """``; candidate: 23 % idle, host syncs: 2`` for each side whose device sat idle more than a few percent
        of its latency, or that synchronised with the host (empty otherwise)."""
        parts = [f"{m.name}: {idle_line(m.extra)}" for m in (self.a, self.b) if notable(m.extra)]
        return ("; " + "; ".join(parts)) if parts else ""

    @property
    def busy_ratio(self) -> float | None:
        """The ratio of the two sides' device busy times (the diagnosis beside a latency), or None."""
        a, b = self.a.extra.get("busy_median_ms"), self.b.extra.get("busy_median_ms")
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a > 0 and b > 0:
            return a / b
        return None

    def disagreement(self, min_speedup: float | None) -> str:
        """Where the device's busy time alone would give another verdict than the latency gives, one sentence
        saying so: the verdict follows the latency, what the caller waits for."""
        busy = self.busy_ratio
        if busy is None or min_speedup is None or counts(self.a.mechanism) != LATENCY:
            return ""
        by_latency = self.faster_by_at_least(min_speedup)
        by_busy = busy <= 1.0 - min_speedup
        if by_latency == by_busy:
            return ""
        return (f"by busy time alone (kernel time only) the ratio is {busy:.4f}, which would "
                f"{'pass' if by_busy else 'fail'}; the verdict follows the latency ({self.ratio:.4f}), what the "
                f"caller waits for{self.idle_text()}")

    def to_dict(self, *, samples: bool = True) -> dict[str, Any]:
        def side(m: Measurement) -> dict[str, Any]:
            data = m.to_dict()
            if not samples:
                data.pop("samples_ms")
            return data

        data = {"a": side(self.a), "b": side(self.b), "ratio": self.ratio, "ci_low": self.ci_low,
                "ci_high": self.ci_high, "confidence": self.confidence, "method": self.method}
        if self.checks:
            data["checks"] = dict(self.checks)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Comparison":
        return cls(a=Measurement.from_dict(data["a"]), b=Measurement.from_dict(data["b"]),
                   ratio=float(data["ratio"]), ci_low=float(data["ci_low"]), ci_high=float(data["ci_high"]),
                   confidence=float(data["confidence"]), method=str(data["method"]),
                   checks=dict(data.get("checks") or {}))


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


watch(__name__)
