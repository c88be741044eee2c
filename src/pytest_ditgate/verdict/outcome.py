"""The verdict of one experiment, decided from test outcomes by a pure function.

Gate failures carry a stable reason code (:class:`~pytest_ditgate.errors.GateFailure`); each code
belongs to one category, and the first failing category in severity order decides the DISCARD reason.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable


class Status(str, enum.Enum):
    KEEP = "keep"
    DISCARD = "discard"
    CRASH = "crash"


class Category(str, enum.Enum):
    INTEGRITY = "integrity"  # fixed paths changed, goldens tampered
    SCOPE = "scope"  # edits outside the mutable paths
    CLASSIFICATION = "classification"  # claimed class contradicted by what the candidate does
    QUALITY = "quality"  # wrong or degraded outputs (correctness and quality gates)
    PERFORMANCE = "performance"  # speed claim not supported by the measurement
    CRASH = "crash"


#: reason code -> category; unknown codes of a failing assertion count as quality
REASON_CATEGORIES: dict[str, Category] = {
    **{code: Category.QUALITY for code in (
        "mismatch", "nonfinite", "shape", "dtype", "input_mutated", "nondeterministic", "stale_output",
        "constant_output", "precision_downgrade", "rounding_bias", "quality", "golden_missing", "unchecked", "metric_missing",
        "output_audit")},
    **{code: Category.INTEGRITY for code in ("timer_tampered", "torch_tampered", "integrity", "golden_tampered",
                                             "fixed_paths")},
    "scope": Category.SCOPE,
    "classification": Category.CLASSIFICATION,
    **{code: Category.PERFORMANCE for code in ("too_slow", "performance", "not_faster")},
    "crash": Category.CRASH,
    "golden_stale": Category.CRASH,  # a baseline frozen with other inputs than its test gives: setup
    "reference_nonfinite": Category.CRASH,  # the gate's own reference is broken: the test's bug, not the candidate's
}

#: severity order for picking the headline reason: integrity first, so that no crash or other failure can
#: hide a tampered path, golden, timer, history or refused option (all of those are exit 12)
SEVERITY = (Category.INTEGRITY, Category.CRASH, Category.SCOPE, Category.CLASSIFICATION, Category.QUALITY,
            Category.PERFORMANCE)

#: process exit codes of an experiment run (pytest's own codes 0-5 keep their meaning otherwise)
EXIT_CODES: dict[str, int] = {
    "keep": 0,
    "discard-quality": 10,
    "discard-performance": 11,
    "discard-integrity": 12,
    "discard-scope": 13,
    "discard-classification": 14,
    "crash": 15,
}


@dataclass(frozen=True)
class GateOutcome:
    """One test's result as the verdict sees it."""

    nodeid: str
    outcome: str  # "passed", "failed", "error", "skipped"
    reason: str | None = None  # GateFailure reason code, when a gate failed
    message: str = ""

    @property
    def category(self) -> Category | None:
        if self.outcome == "error":
            return Category.CRASH
        if self.outcome != "failed":
            return None
        if self.reason is None:
            return Category.QUALITY  # a plain failing assertion in a gate suite: the output is not right
        return REASON_CATEGORIES.get(self.reason, Category.QUALITY)


@dataclass(frozen=True)
class Verdict:
    status: Status
    category: Category | None
    reasons: tuple[str, ...] = ()
    experiment_class: str | None = None
    declared_class: str | None = None
    lane: str | None = None
    objective: dict[str, Any] | None = None
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def label(self) -> str:
        if self.status is Status.DISCARD and self.category is not None:
            return f"discard-{self.category.value}"
        return self.status.value

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.label]

    def headline(self) -> str:
        status, _, category = self.label.partition("-")
        text = status.upper() + (f" ({category})" if category else "")
        if self.reasons:
            text += ": " + self.reasons[0]
            if len(self.reasons) > 1:
                text += f" (+{len(self.reasons) - 1} more)"
        return text

    def lines(self, *, limit: int = 20) -> list[str]:
        """The verdict as the judge and an advisory run print it: the headline with the exit code, the class
        when the evidence overrode the claim, the objective, and the reasons (the first ``limit``)."""
        lines = [f"VERDICT: {self.headline()}  (exit code {self.exit_code})"]
        if self.declared_class != self.experiment_class:
            lines.append(f"class: declared {self.declared_class}, judged as {self.experiment_class}")
        if self.objective:
            o = self.objective
            lines.append(f"objective: {o['metric']}: {o['ratio']:.4f} (CI {o['ci_low']:.4f}..{o['ci_high']:.4f})"
                         + (f"; {o['vs_best']}" if o.get("vs_best") else ""))
        lines += [f"  - {reason}" for reason in self.reasons[:limit]]
        if len(self.reasons) > limit:
            lines.append(f"  ... and {len(self.reasons) - limit} more (verdict.json lists every one)")
        return lines

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        data["category"] = self.category.value if self.category else None
        data["label"] = self.label
        data["exit_code"] = self.exit_code
        data["reasons"] = list(self.reasons)
        return data


def decide(outcomes: Iterable[GateOutcome], *, session_problems: Iterable[tuple[Category, str]] = (),
           experiment_class: str | None = None, declared_class: str | None = None, lane: str | None = None,
           objective: dict[str, Any] | None = None) -> Verdict:
    """KEEP only when no test failed or errored and no session-level problem exists."""
    outcomes = list(outcomes)
    problems: dict[Category, list[str]] = {}
    for category, text in session_problems:
        problems.setdefault(category, []).append(text)
    for outcome in outcomes:
        category = outcome.category
        if category is not None:
            code = f"[{outcome.reason}] " if outcome.reason else ""
            first_line = outcome.message.strip().splitlines()[0] if outcome.message.strip() else outcome.outcome
            problems.setdefault(category, []).append(f"{outcome.nodeid}: {code}{first_line}"[:500])
    counts: dict[str, int] = {}
    for outcome in outcomes:
        counts[outcome.outcome] = counts.get(outcome.outcome, 0) + 1
    common = dict(experiment_class=experiment_class, declared_class=declared_class, lane=lane,
                  objective=objective, counts=counts)
    for category in SEVERITY:
        if category in problems:
            status = Status.CRASH if category is Category.CRASH else Status.DISCARD
            ordered = [text for cat in SEVERITY for text in problems.get(cat, [])]
            return Verdict(status, category, tuple(ordered), **common)
    return Verdict(Status.KEEP, None, (), **common)
