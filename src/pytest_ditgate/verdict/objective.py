"""The lane's objective: candidate time over baseline time, measured side by side in the same run.

Each ``ditbench.pair`` comparison gives a ratio (below 1: the candidate is faster) with a confidence
interval. Several comparisons combine into their geometric mean, with the geometric means of the bounds
as a conservative interval. Lane bests store the same quantity, so runs on different days compare
ratios to the baseline implementation, never absolute times.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

#: the label of a comparison against the lane's best (``ditbench.pair(..., labels=("candidate", LANE_BEST_LABEL))``
#: in a suite; the judge's own timing names its ratios so too)
LANE_BEST_LABEL = "lane-best"


#: a host drift below this factor is not named in the verdict's reason (it still scales the bound)
DRIFT_NOTE = 1.02


def is_versus_best(comparison: dict[str, Any]) -> bool:
    """Whether a comparison measured the candidate against the lane's best (not against the baseline)."""
    flagged = comparison.get("versus_best")
    if flagged is not None:
        return bool(flagged)
    return str(comparison.get("name", "")).endswith(f"/ {LANE_BEST_LABEL}")


def judge_objective(comparisons: Iterable[dict[str, Any]], best: dict[str, Any] | None, *,
                    min_improvement: float = 0.0) -> tuple[dict[str, Any] | None, str | None]:
    """The objective of a run and, when it does not beat the lane's best, why: the one rule the judge and an
    advisory ``--ditgate-lane`` run both apply.

    The candidate must beat the best (``beats_best``: the re-measured best decides when measured), and its ratio
    to the baseline implementation must not be above the best's recorded one: a candidate that only reads faster
    than a re-measured best that happened to run slow is no new best."""
    comparisons = list(comparisons)
    objective = combine([c for c in comparisons if not is_versus_best(c)])
    if objective is None:
        return None, None
    better, why = beats_best(objective, best, min_improvement=min_improvement,
                             remeasured=combine([c for c in comparisons if is_versus_best(c)]),
                             host_drift=host_drift(comparisons, best))
    if better and best is not None and objective["ratio"] > float(best["objective"]["ratio"]):
        better, why = False, (f"not faster than the lane best: ratio to the baseline implementation "
                              f"{objective['ratio']:.4f} is above the best's {float(best['objective']['ratio']):.4f} "
                              f"(the re-measured best alone does not decide: {why})")
    objective["vs_best"] = why
    return objective, None if better else why


def combine(comparisons: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """Objective of a run (None when it made no side-by-side comparison)."""
    items = [c for c in comparisons if c.get("ratio")]
    if not items:
        return None

    def gmean(key: str) -> float:
        return _gmean([float(c[key]) for c in items])

    return {
        "metric": "time ratio candidate/baseline (lower is better)",
        "ratio": gmean("ratio"),
        "ci_low": gmean("ci_low"),
        "ci_high": gmean("ci_high"),
        "n_comparisons": len(items),
        "names": [c.get("name") for c in items],
        "method": sorted({str(c.get("method")) for c in items}),
    }


def host_drift(comparisons: Iterable[dict[str, Any]], best: dict[str, Any] | None) -> float:
    """How far this run's host ran from the best's run's, as a factor >= 1: per comparison timed on the host's
    clock in both runs, the fixed reference's median here against its median there (either way round),
    combined as the objective combines ratios (geometric mean). 1.0 where nothing can be compared.

    The reference is the same code in both runs, so its time says how differently loaded the host was. Load
    does not cancel in a ratio: a reference using torch's intra-op threads slows 1.6x to 2x on a busy two-core
    host while a small single-threaded candidate slows 1.2x, which moves their ratio by up to the reference's
    factor (``benchmarks/results/host_drift_cpu.json``)."""
    from pytest_ditgate.bench.mechanisms import DEVICE_TIMERS

    if best is None:
        return 1.0
    recorded = {_pair_key(c): c for c in best.get("comparisons") or [] if isinstance(c, dict)}
    factors = []
    for c in comparisons:
        if is_versus_best(c) or _timer(c) in DEVICE_TIMERS:
            continue
        then = recorded.get(_pair_key(c))
        if then is None or _timer(then) in DEVICE_TIMERS:
            continue
        try:
            now_ms, then_ms = float(c["reference_median_ms"]), float(then["reference_median_ms"])
        except (KeyError, TypeError, ValueError):
            continue
        if math.isfinite(now_ms) and math.isfinite(then_ms) and now_ms > 0 and then_ms > 0:
            factors.append(max(now_ms / then_ms, then_ms / now_ms))
    return _gmean(factors) if factors else 1.0


def _gmean(values: list[float]) -> float:
    """The geometric mean of positive values (how ratios combine)."""
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _pair_key(comparison: dict[str, Any]) -> str:
    """A comparison's ``test::candidate / reference`` name, as the judge records it (an advisory run's report row
    names the pair alone and its test apart)."""
    name = str(comparison.get("name"))
    return name if "::" in name or not comparison.get("test") else f"{comparison['test']}::{name}"


def _timer(comparison: dict[str, Any]) -> str:
    """The mechanism's name (a report row's ``cupti: kernel time only`` is ``cupti``)."""
    return str(comparison.get("mechanism")).split(":", 1)[0]


def beats_best(objective: dict[str, Any], best: dict[str, Any] | None, *, min_improvement: float = 0.0,
               remeasured: dict[str, Any] | None = None, host_drift: float = 1.0) -> tuple[bool, str]:
    """Whether the candidate is confidently faster than the lane's best (the first run of a lane always is).

    ``remeasured`` (candidate / best measured side by side in this run) decides when present: a best
    recorded from one lucky run cannot hold the lane hostage. Otherwise the candidate's ratio to the
    baseline implementation is compared with the best's recorded one, interval with interval: the best was
    measured in another run and is known only within its confidence interval, so the candidate's upper bound
    must beat the best's lower bound (by ``min_improvement``). Against the best's point ratio, a best that
    read high by chance (a loaded host: 1.095 where the same code reads 1.02 to 1.07) lets no-ops through.
    Where the host ran ``host_drift`` times faster or slower than in the best's run, the gain must exceed that
    factor too: it is as far as the change in load can move the ratio.
    """
    if best is None:
        return True, "first result on this lane and arch"
    if remeasured is not None:
        bound = 1.0 - min_improvement
        verdict = remeasured["ci_high"] < bound
        text = (f"candidate / re-measured lane best = {remeasured['ratio']:.4f} (CI {remeasured['ci_low']:.4f}.."
                f"{remeasured['ci_high']:.4f}, same run)")
        return verdict, (f"{text} beats the best" if verdict else f"not faster than the lane best: {text}")
    best_ratio = float(best["objective"]["ratio"])
    best_low = _lower_bound(best["objective"], best_ratio)
    drift = max(1.0, host_drift)
    bound = best_low * (1.0 - min_improvement) / drift
    best_text = f"{best_ratio:.4f}" + (f" (CI low {best_low:.4f})" if best_low != best_ratio else "")
    load = "" if drift <= DRIFT_NOTE else (
        f"; the fixed reference's time here is {drift:.2f}x off its time in the best's run, so the gain must "
        f"exceed that factor too (bound {bound:.4f}): a host loaded differently moves the ratio by up to "
        f"that factor; re-measure the best in the same run (a versus-lane-best pair) or give the lane a timing "
        f"module")
    if objective["ci_high"] < bound:
        return True, (f"ratio {objective['ratio']:.4f} (CI high {objective['ci_high']:.4f}) beats the lane best "
                      f"{best_text}{load}")
    return False, (f"not faster than the lane best: ratio {objective['ratio']:.4f} (CI {objective['ci_low']:.4f}.."
                   f"{objective['ci_high']:.4f}) vs best {best_text} from {best.get('commit') or 'an earlier run'}"
                   f"{load}")


def _lower_bound(recorded: dict[str, Any], ratio: float) -> float:
    """The recorded best's CI lower bound, when it has a usable one (else its ratio: a best of an older record)."""
    try:
        low = float(recorded.get("ci_low", ratio))
    except (TypeError, ValueError):
        return ratio
    return low if math.isfinite(low) and 0 < low <= ratio else ratio


def improvement_pct(objective: dict[str, Any], best: dict[str, Any] | None) -> float | None:
    if best is None:
        return None
    return (float(best["objective"]["ratio"]) / objective["ratio"] - 1.0) * 100.0
