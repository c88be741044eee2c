"""The pure part of finishing an experiment: verdict, ledger row, history record, built from facts.

Nothing here writes or runs anything; :mod:`judge` and :mod:`publish` do the guarded writes, so the verdict
file, the ledger row, the history record and the exit code all come from the one :class:`Verdict` built here.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any

from pytest_ditgate.verdict.outcome import Category, GateOutcome, Verdict


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
    #: ``name@key`` of every output the child wrote (a baseline's second run must match the first's)
    outputs_seen: list[str] = field(default_factory=list)


def build(facts: Facts, *, speed: bool = True) -> tuple[Verdict, dict[str, Any], dict[str, Any]]:
    """(verdict, detail record for verdict.json / experiments.jsonl, results.tsv row): decided by
    ``verdict.evaluate`` from the facts, as an advisory run decides from its own evidence."""
    from pytest_ditgate.verdict.evaluate import Evidence, evaluate
    from pytest_ditgate.verdict.objective import improvement_pct

    evaluation = evaluate(Evidence(
        outcomes=facts.outcomes, comparisons=facts.comparisons, declared_class=facts.declared_class,
        class_evidence=facts.class_evidence, lane=facts.lane, best=facts.best_before,
        min_improvement=facts.min_improvement, problems=facts.problems, speed=speed))
    verdict, objective = evaluation.verdict, evaluation.objective
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
