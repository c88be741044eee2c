"""Deciding apart from acting: one pure ``evaluate(evidence) -> Verdict`` for the judge (``ditgate experiment``)
and an advisory ``pytest --ditgate --ditgate-lane`` run.

Each gathers its evidence its own way (the judge from its child's folder and its own timing, an advisory run from
its own reports) and then decides by the same rules, each with one home: the class (``classify``), the
objective against the lane's best (``objective.judge_objective``), the scope of the change
(``scope.scope_problems``) and the severity order of the reasons (``outcome.decide``). Nothing here reads a file,
prints or writes: what is decided is the evidence's alone, and a test can give it any evidence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from pytest_ditgate.verdict.outcome import Category, GateOutcome, Verdict, decide


@dataclass(frozen=True)
class Evidence:
    """What a run showed about a candidate.

    - ``outcomes``: each test's gate outcome (``reports.OutcomeBook``);
    - ``comparisons``: side-by-side ratios (``ratio``, ``ci_low``, ``ci_high``; against the lane's best where
      ``versus_best`` or the name says so);
    - ``declared_class`` and ``class_evidence`` (``quant: ...`` / ``approx: ...`` tagged lines): the claim and
      what executed;
    - ``best``: the lane's best record (None: the lane's first result); ``min_improvement``: its noise floor;
    - ``changed``, ``mutable``, ``fixed``: the scope of the change (``changed`` None: not judged here);
    - ``problems``: session-level findings of whoever gathered the evidence (integrity, a crash), by category;
    - ``speed``: whether the run's speed is judged (a run that ended before its tests has none);
    - ``require_a_test``: a run in which no test passed or failed is a crash.
    """

    outcomes: Iterable[GateOutcome] = ()
    comparisons: Iterable[dict[str, Any]] = ()
    declared_class: str = "numerical"
    class_evidence: Iterable[str] = ()
    lane: str | None = None
    best: dict[str, Any] | None = None
    min_improvement: float = 0.0
    changed: list[str] | None = None
    mutable: list[str] = field(default_factory=list)
    fixed: list[str] = field(default_factory=list)
    problems: Iterable[tuple[Category, str]] = ()
    speed: bool = True
    require_a_test: bool = False


@dataclass(frozen=True)
class Evaluation:
    """The verdict and what it was decided from (the class, the objective), for the records."""

    verdict: Verdict
    effective_class: str
    class_evidence: tuple[str, ...]
    objective: dict[str, Any] | None


def evaluate(evidence: Evidence) -> Evaluation:
    """The verdict of a run from its evidence alone (pure: the same evidence, the same verdict)."""
    from pytest_ditgate.verdict.classify import classify_tagged
    from pytest_ditgate.verdict.objective import combine, is_versus_best, judge_objective
    from pytest_ditgate.verdict.scope import scope_problems

    classification = classify_tagged(evidence.declared_class, evidence.class_evidence)
    problems = list(evidence.problems)
    outcomes = list(evidence.outcomes)
    if evidence.changed is not None:
        problems += scope_problems(list(evidence.changed), list(evidence.mutable), list(evidence.fixed))
    if evidence.require_a_test and not any(o.outcome in ("passed", "failed") for o in outcomes):
        problems.append((Category.CRASH, "no test ran (collected none, or skipped all)"))
    objective = None
    if evidence.speed and evidence.lane:
        objective, slower = judge_objective(evidence.comparisons, evidence.best,
                                            min_improvement=evidence.min_improvement)
        if slower is not None:
            problems.append((Category.PERFORMANCE, slower))
    elif evidence.speed:  # no lane: the run's ratios, with no best to beat
        objective = combine([c for c in evidence.comparisons if not is_versus_best(c)])
    verdict = decide(outcomes, session_problems=problems, experiment_class=classification.effective,
                     declared_class=evidence.declared_class, lane=evidence.lane, objective=objective)
    return Evaluation(verdict, classification.effective, tuple(classification.evidence), objective)
