"""Pure statistics for timing samples: summaries and confidence intervals for a ratio of medians.

No torch, no numpy: the recorder, the ledger and the terminal summary use these on any machine, and the
tests check them against hand-computed values.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Sequence

from pytest_ditgate.timer_integrity import watch

#: number of bootstrap resamples; enough for a stable 95 % or 99 % bound, cheap in pure Python
BOOTSTRAP_RESAMPLES = 2000


def quantile(samples: Sequence[float], q: float) -> float:
    """The ``q`` quantile with linear interpolation between order statistics (numpy's default)."""
    if not samples:
        raise ValueError("quantile of no samples")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {q}")
    ordered = sorted(samples)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def median(samples: Sequence[float]) -> float:
    return quantile(samples, 0.5)


@dataclass(frozen=True)
class Summary:
    """Descriptive statistics of one sample set (milliseconds in, milliseconds out)."""

    n: int
    median: float
    mean: float
    stdev: float  # sample standard deviation (n - 1); 0 for a single sample
    variance: float
    cv: float  # stdev / mean; 0 when the mean is 0
    iqr: float
    q1: float
    q3: float
    min: float
    max: float
    p95: float


def summarize(samples: Sequence[float]) -> Summary:
    """Summary statistics of ``samples``; raises ValueError for an empty or non-finite set."""
    values = [float(x) for x in samples]
    if not values:
        raise ValueError("no samples to summarize")
    if not all(math.isfinite(x) for x in values):
        raise ValueError("samples contain NaN or infinity")
    n = len(values)
    mean = math.fsum(values) / n
    variance = math.fsum((x - mean) ** 2 for x in values) / (n - 1) if n > 1 else 0.0
    stdev = math.sqrt(variance)
    q1, q3 = quantile(values, 0.25), quantile(values, 0.75)
    return Summary(
        n=n,
        median=quantile(values, 0.5),
        mean=mean,
        stdev=stdev,
        variance=variance,
        cv=stdev / mean if mean else 0.0,
        iqr=q3 - q1,
        q1=q1,
        q3=q3,
        min=min(values),
        max=max(values),
        p95=quantile(values, 0.95),
    )


@dataclass(frozen=True)
class RatioInterval:
    """A ratio of medians ``a / b`` with a two-sided confidence interval and the method that made it."""

    ratio: float
    low: float
    high: float
    confidence: float
    method: str


def _check_inputs(a: Sequence[float], b: Sequence[float], confidence: float) -> None:
    if not a or not b:
        raise ValueError("a ratio needs samples on both sides")
    if not 0.5 <= confidence < 1.0:
        raise ValueError(f"confidence must be in [0.5, 1), got {confidence}")
    if min(b) <= 0 or min(a) <= 0:
        raise ValueError("timing samples must be positive")


def bootstrap_ratio(a: Sequence[float], b: Sequence[float], *, confidence: float = 0.95,
                    paired: bool = False, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> RatioInterval:
    """Percentile-bootstrap interval of ``median(a) / median(b)``.

    ``paired=True`` resamples rounds (index ``i`` of both sides together): for samples taken
    interleaved A B A B, slow drift moves both sides of a round alike and cancels in the ratio.
    The seed is fixed so that the same samples always give the same verdict.
    """
    _check_inputs(a, b, confidence)
    if paired and len(a) != len(b):
        raise ValueError(f"paired bootstrap needs equal sample counts, got {len(a)} and {len(b)}")
    rng = random.Random(seed)
    ratios = []
    na, nb = len(a), len(b)
    indices = range(na)
    for _ in range(resamples):
        if paired:
            picks = rng.choices(indices, k=na)
            ra = [a[i] for i in picks]
            rb = [b[i] for i in picks]
        else:
            ra = rng.choices(a, k=na)
            rb = rng.choices(b, k=nb)
        ratios.append(median(ra) / median(rb))
    tail = (1.0 - confidence) / 2.0
    return RatioInterval(
        ratio=median(a) / median(b),
        low=quantile(ratios, tail),
        high=quantile(ratios, 1.0 - tail),
        confidence=confidence,
        method="paired-bootstrap" if paired else "bootstrap",
    )


def _normal_quantile(p: float) -> float:
    """Inverse of the standard normal CDF (Acklam's rational approximation, |error| < 1.2e-9)."""
    a = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02, 1.383577518672690e02,
         -3.066479806614716e01, 2.506628277459239e00)
    b = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02, 6.680131188771972e01,
         -1.328068155288572e01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00, -2.549732539343734e00,
         4.374664141464968e00, 2.938163982698783e00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00, 3.754408661907416e00)
    low = 0.02425
    if p < low:
        q = math.sqrt(-2 * math.log(p))
        return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / \
               ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
    if p > 1 - low:
        return -_normal_quantile(1 - p)
    q = p - 0.5
    r = q * q
    return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q / \
           (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)


def mann_whitney_ratio(a: Sequence[float], b: Sequence[float], *, confidence: float = 0.95) -> RatioInterval:
    """Hodges-Lehmann estimate and Mann-Whitney (Moses) interval of the ratio, on log times.

    The ratio is ``exp(median of all pairwise log(a_i) - log(b_j))``; the bounds are order statistics
    of those differences chosen from the normal approximation of the Mann-Whitney U statistic.
    """
    _check_inputs(a, b, confidence)
    la = [math.log(x) for x in a]
    lb = [math.log(x) for x in b]
    diffs = sorted(x - y for x in la for y in lb)
    m, n = len(la), len(lb)
    z = _normal_quantile(1.0 - (1.0 - confidence) / 2.0)
    k = int(math.floor(m * n / 2.0 - z * math.sqrt(m * n * (m + n + 1) / 12.0)))
    k = max(0, min(k, len(diffs) - 1))
    return RatioInterval(
        ratio=math.exp(median(diffs)),
        low=math.exp(diffs[k]),
        high=math.exp(diffs[len(diffs) - 1 - k]),
        confidence=confidence,
        method="mann-whitney",
    )


METHODS = ("bootstrap", "paired-bootstrap", "mann-whitney")


def ratio_interval(a: Sequence[float], b: Sequence[float], *, method: str = "bootstrap",
                   confidence: float = 0.95) -> RatioInterval:
    """Dispatch to one of :data:`METHODS`."""
    if method == "bootstrap":
        return bootstrap_ratio(a, b, confidence=confidence)
    if method == "paired-bootstrap":
        return bootstrap_ratio(a, b, confidence=confidence, paired=True)
    if method == "mann-whitney":
        return mann_whitney_ratio(a, b, confidence=confidence)
    raise ValueError(f"unknown comparison method {method!r}; choose from {', '.join(METHODS)}")


watch(__name__)
