"""The pure part of finishing an experiment: verdict, ledger row, history record, built from facts.

Nothing here writes or runs anything; :mod:`judge` does the guarded writes, so the verdict file, the
ledger row, the history record and the exit code all come from the one :class:`Verdict` built here.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any

from pytest_ditgate.verdict.outcome import Category, GateOutcome, Verdict, decide


@dataclass
class Facts:
    """What the judge established about one run."""

    lane: str
    declared_class: str
    effective_class: str
    class_evidence: list[str]
    description: str
    commit: str | None
    parent: str | None
    arch: str
    outcomes: list[GateOutcome] = field(default_factory=list)
    problems: list[tuple[Category, str]] = field(default_factory=list)
    comparisons: list[dict[str, Any]] = field(default_factory=list)
    quality: list[dict[str, Any]] = field(default_factory=list)
    best_before: dict[str, Any] | None = None
    candidate_config: dict[str, Any] | None = None
    environment: dict[str, Any] = field(default_factory=dict)
    changed_paths: list[str] | None = None
    child: dict[str, Any] = field(default_factory=dict)
    anchors: dict[str, Any] = field(default_factory=dict)
    min_improvement: float = 0.0


def objective_and_speed(facts: Facts) -> dict[str, Any] | None:
    """The objective from the re-derived comparisons; a performance problem when it does not beat the best."""
    from pytest_ditgate.verdict.objective import beats_best, combine

    objective = combine([c for c in facts.comparisons if not c["versus_best"]])
    if objective is None:
        return None
    best = facts.best_before
    better, why = beats_best(objective, best, min_improvement=facts.min_improvement,
                             remeasured=combine([c for c in facts.comparisons if c["versus_best"]]))
    if better and best is not None and objective["ratio"] > float(best["objective"]["ratio"]):
        better, why = False, (f"not faster than the lane best: ratio to the baseline implementation "
                              f"{objective['ratio']:.4f} is above the best's {float(best['objective']['ratio']):.4f} "
                              f"(the re-measured best alone does not decide: {why})")
    objective["vs_best"] = why
    if not better:
        facts.problems.append((Category.PERFORMANCE, why))
    return objective


def build(facts: Facts, *, speed: bool = True) -> tuple[Verdict, dict[str, Any], dict[str, Any]]:
    """(verdict, detail record for verdict.json / experiments.jsonl, results.tsv row)."""
    from pytest_ditgate.verdict.objective import improvement_pct

    objective = objective_and_speed(facts) if speed else None
    verdict = decide(facts.outcomes, session_problems=facts.problems, experiment_class=facts.effective_class,
                     declared_class=facts.declared_class, lane=facts.lane, objective=objective)
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    best = facts.best_before
    detail = {
        "time_utc": now, "verdict": verdict.to_dict(), "commit": facts.commit, "parent": facts.parent,
        "arch": facts.arch, "description": facts.description,
        "classification": {"declared": facts.declared_class, "effective": facts.effective_class,
                           "evidence": facts.class_evidence},
        "comparisons": facts.comparisons, "quality": facts.quality, "best_before": best,
        "candidate_config": facts.candidate_config, "changed_paths": facts.changed_paths,
        "environment": facts.environment, "child": facts.child, "anchors": facts.anchors,
    }
    failed = [q for q in facts.quality if not q.get("passed", True)]
    row = {
        "timestamp": now, "commit": facts.commit, "parent": facts.parent, "status": verdict.label,
        "class": facts.effective_class, "objective_metric": objective["metric"] if objective else "",
        "best_before": best["objective"]["ratio"] if best else None,
        "candidate": objective["ratio"] if objective else None,
        "improvement_pct": improvement_pct(objective, best) if objective else None,
        "peak_vram_gb": None,
        "quality": (f"FAIL {len(failed)}/{len(facts.quality)} cases" if failed
                    else f"ok {len(facts.quality)} cases" if facts.quality else ""),
        "description": facts.description,
    }
    return verdict, detail, row


def history_body(verdict: Verdict, detail: dict[str, Any]) -> dict[str, Any]:
    """The lane-history record of an experiment; a KEEP carries the new best."""
    body = {"kind": "experiment", "time_utc": detail["time_utc"], "commit": detail["commit"], "label": verdict.label,
            "description": detail["description"]}
    objective = verdict.objective
    if verdict.label == "keep" and objective is not None:
        body["best"] = {"objective": {k: objective[k] for k in ("ratio", "ci_low", "ci_high", "metric")},
                        "commit": detail["commit"], "time_utc": detail["time_utc"],
                        "candidate_config": detail["candidate_config"], "comparisons": detail["comparisons"]}
    return body
