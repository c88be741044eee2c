"""One pure ``evaluate(evidence) -> Verdict`` decides for the judge and for an advisory ``--ditgate-lane`` run
(issue 46, item 2): the objective against the lane's best, the scope rule, reading reports into outcomes, the
golden tensor names and the printed verdict each have one home, so an advisory KEEP is never a judged DISCARD
for a rule only one of them applies.
"""

from __future__ import annotations

import json

import pytest

from pytest_ditgate.golden.names import match_names
from pytest_ditgate.verdict.evaluate import Evidence, evaluate
from pytest_ditgate.verdict.outcome import Category, GateOutcome
from pytest_ditgate.verdict.reports import OutcomeBook

BEST = {"objective": {"ratio": 0.50, "ci_low": 0.48, "ci_high": 0.52}, "commit": "abc1234"}


def comparison(ratio: float, *, versus_best: bool = False, spread: float = 0.01) -> dict:
    name = "t::candidate / " + ("lane-best" if versus_best else "reference")
    return {"name": name, "ratio": ratio, "ci_low": ratio - spread, "ci_high": ratio + spread}


PASSED = [GateOutcome("t::test_quality", "passed")]


def test_the_first_result_of_a_lane_keeps() -> None:
    evaluation = evaluate(Evidence(outcomes=PASSED, comparisons=[comparison(0.9)], lane="l"))
    assert evaluation.verdict.label == "keep"
    assert evaluation.objective["vs_best"] == "first result on this lane and arch"


def test_a_remeasured_best_that_ran_slow_does_not_make_a_new_best() -> None:
    """The candidate reads faster than a best re-measured slow in its run, but its ratio to the baseline
    implementation (0.70) is above the best's recorded 0.50: not a new best, on both paths."""
    evidence = Evidence(outcomes=PASSED, comparisons=[comparison(0.70), comparison(0.80, versus_best=True)],
                        lane="l", best=BEST)
    verdict = evaluate(evidence).verdict
    assert verdict.label == "discard-performance" and verdict.exit_code == 11
    assert "ratio to the baseline implementation 0.7000 is above the best's 0.5000" in verdict.reasons[0]


def test_a_real_gain_over_the_best_keeps() -> None:
    evidence = Evidence(outcomes=PASSED, comparisons=[comparison(0.40), comparison(0.80, versus_best=True)],
                        lane="l", best=BEST, min_improvement=0.02)
    assert evaluate(evidence).verdict.label == "keep"


def test_the_scope_rule_and_its_categories() -> None:
    evidence = Evidence(outcomes=PASSED, lane="l", changed=["src/k.py", "golden/g.bin", "README.md"],
                        mutable=["src/"], fixed=["golden/"], speed=False)
    verdict = evaluate(evidence).verdict
    assert verdict.label == "discard-integrity"  # a fixed path outranks an out-of-scope one
    assert verdict.reasons == ("golden/g.bin: a fixed path, changed since the lane's anchors",
                               "README.md: outside the mutable paths (src/)")
    nothing_mutable = Evidence(outcomes=PASSED, lane="l", changed=["src/k.py"], speed=False)
    assert evaluate(nothing_mutable).verdict.label == "discard-scope"


def test_the_evidence_of_what_executed_overrides_the_claim() -> None:
    evaluation = evaluate(Evidence(outcomes=PASSED, declared_class="numerical",
                                   class_evidence=["quant: tensor w has dtype int8"], speed=False))
    assert evaluation.effective_class == "quantization"
    assert "class: declared numerical, judged as quantization" in evaluation.verdict.lines()


def test_a_run_with_no_test_is_a_crash_where_a_test_is_required() -> None:
    skipped = [GateOutcome("t::a", "skipped")]
    assert evaluate(Evidence(outcomes=skipped, require_a_test=True)).verdict.label == "crash"
    assert evaluate(Evidence(outcomes=skipped)).verdict.label == "keep"


def test_verdict_lines_are_what_both_print() -> None:
    evidence = Evidence(outcomes=[GateOutcome(f"t::{i}", "failed", "mismatch", f"bad {i}") for i in range(23)])
    lines = evaluate(evidence).verdict.lines()
    assert lines[0].startswith("VERDICT: DISCARD (quality): t::0: [mismatch] bad 0 (+22 more)")
    assert lines[0].endswith("(exit code 10)")
    assert lines[-1] == "  ... and 3 more (verdict.json lists every one)"
    assert sum(line.startswith("  - ") for line in lines) == 20


def test_reports_become_outcomes_phase_by_phase() -> None:
    book = OutcomeBook()
    book.add("a", "setup", "passed")
    book.add("a", "call", "passed")
    book.add("a", "teardown", "failed", None, "boom")  # a teardown error after a passed call
    book.add("b", "setup", "skipped")
    book.add("c", "call", "failed", "mismatch", "off by 3 ulp")
    book.add("d", "setup", "failed", "golden_stale", "frozen for other inputs")  # a gate's reason: a gate failure
    assert book.outcomes["a"].outcome == "error" and book.outcomes["a"].category is Category.CRASH
    assert book.outcomes["b"].outcome == "skipped"
    assert book.outcomes["c"] == GateOutcome("c", "failed", "mismatch", "off by 3 ulp")
    assert book.outcomes["d"].outcome == "failed"
    assert book.ran == {"a", "c"}


def test_golden_tensor_names_one_rule() -> None:
    matched = match_names(["latents", "block.0", "block.1"], ["latents", "extra"], optional=["block.*"])
    assert matched.shared == ("latents",) and matched.not_compared == ("block.0", "block.1")
    assert not matched.ok and matched.failures() == ["FAIL extra: not in the golden (refreeze to add it)"]
    assert match_names(["a"], ["b"]).failures() == ["FAIL a: missing from the candidate (required)",
                                                   "FAIL b: not in the golden (refreeze to add it)",
                                                   "FAIL: no tensor in common with the golden: nothing was compared"]


LANE_TEST = """
import time


def work(seconds):
    def run(x):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
        return x
    return run


def test_speed(ditbench):
    ditbench.pair(work(0.002), work(0.002), 1.0, min_speedup=None, labels=("candidate", "reference"))


def test_versus_best(ditbench):
    ditbench.pair(work(0.002), work(0.006), 1.0, min_speedup=None, labels=("candidate", "lane-best"))
"""


def test_an_advisory_run_applies_the_judges_objective(pytester: pytest.Pytester) -> None:
    """The candidate is as fast as its reference (ratio about 1) and reads 3x faster than a lane best that
    runs slow here, but the best's recorded ratio is 0.5: the judge would say 11, and so does the advisory run
    (it used to say KEEP)."""
    from pytest_ditgate.device import real_device

    pytester.makepyfile(test_lane=LANE_TEST)
    pytester.makepyprojecttoml('[tool.ditgate.lanes.l]\ntests = ["test_lane.py"]\n')
    best = pytester.path / ".ditgate" / "best" / f"l__{real_device().arch}.json"
    best.parent.mkdir(parents=True)
    best.write_text(json.dumps(BEST))
    assert pytester.runpytest("--ditgate", "--ditgate-relock", "--co", "-p", "no:cacheprovider").ret == 0
    result = pytester.runpytest("--ditgate", "--ditgate-lane=l", "--ditgate-verdict-json=verdict.json",
                                "-p", "no:cacheprovider")
    verdict = json.loads((pytester.path / "verdict.json").read_text())["verdict"]
    assert result.ret == verdict["exit_code"] == 11, result.stdout.str()[-3000:]
    assert "is above the best's 0.5000" in verdict["reasons"][0]
    result.stdout.fnmatch_lines(["VERDICT: DISCARD (performance): not faster than the lane best*(exit code 11)"])
