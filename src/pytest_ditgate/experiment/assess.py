"""What one run of the lane's tests establishes: the child's evidence read into the :class:`Facts`, and the
judge's own timing of the lane, which replaces anything the child timed in the candidate's process."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from pytest_ditgate import git
from pytest_ditgate.bench.mechanisms import DEVICE_TIMERS
from pytest_ditgate.experiment.child_process import child_env
from pytest_ditgate.experiment.preflight import quality_contract
from pytest_ditgate.experiment.record import Facts
from pytest_ditgate.experiment.rounds import HOST_GAIN_FLOOR, time_lane
from pytest_ditgate.verdict.classify import classify_tagged
from pytest_ditgate.verdict.outcome import Category

if TYPE_CHECKING:
    from pytest_ditgate.verdict.lane import LaneSpec


@dataclass
class Assessor:
    """Judges the child's folder with fixed code, and times the lane, for one lane of one project."""

    root: Path
    lane: LaneSpec
    declared: str
    project: Mapping[str, Any]
    judge_env: Mapping[str, str]

    def judge_child(self, facts: Facts, out: Path, returncode: int, expected: dict[str, Any], *,
                    freeze: bool) -> None:
        """Add what the child's folder ``out`` shows to ``facts``: outcomes, the classification, quality
        against ``expected`` (what the baseline froze) and the comparisons."""
        from pytest_ditgate.experiment.evidence import judge_outputs, judge_timings, read_child, required_ran

        evidence = read_child(out)
        facts.outcomes = list(evidence.outcomes.values())
        facts.child = {"folder": str(out), "exit_code": returncode, "ran": sorted(evidence.ran),
                       "observed": {k: evidence.observed.get(k)
                                    for k in ("modules", "gemms", "tf32_gemms", "ops", "scan_s", "collected")},
                       "unparsable_lines": evidence.skipped_lines}
        if returncode not in (0, 1):
            facts.problems.append((Category.CRASH, f"the lane's pytest run exited with {returncode} "
                                                   f"({'no tests collected' if returncode == 5 else 'not a test outcome'})"))
        for line in required_ran(evidence, self.lane.required):
            facts.problems.append((Category.CRASH, line))
        observed = evidence.observed
        if observed.get("observed"):
            print(f"ditgate: observed in the candidate's process: {observed.get('ops', 0)} ops "
                  f"({observed.get('gemms', 0)} GEMM/conv), {observed.get('modules', 0)} modules scanned "
                  f"in {float(observed.get('scan_s') or 0):.2f} s", flush=True)
        if evidence.ran and not (observed.get("observed") and (observed.get("ops") or observed.get("modules"))):
            # any op observed is an observation: a softmax or a layernorm kernel runs no GEMM and builds no module,
            # and its operands are judged like any other's; only a run the observer saw nothing of is unchecked
            facts.problems.append((Category.INTEGRITY, "class unchecked: the run recorded no observation of what "
                                                       "executed (no op went through torch's dispatcher, no module "
                                                       "was alive): see ditgate_candidate.declare in docs/agent_loop.md"))
        quant = [f"quant: {e}" for e in observed.get("evidence", [])]
        tagged = quant + [str(e) for e in observed.get("declared", []) if str(e) not in quant]
        classification = classify_tagged(self.declared, tagged)
        facts.effective_class = classification.effective
        facts.class_evidence = list(classification.evidence)
        facts.candidate_config = observed.get("candidate_config") or None
        if not freeze:
            facts.quality = judge_outputs(self.root, evidence, expected.get("outputs", []), classification.effective,
                                          quality_contract(self.root, self.project), facts.arch, facts.problems)
        if self.lane.timing is not None and not freeze:
            # the judge times the lane itself: what the child timed in its own process, if anything, is not evidence
            facts.child["advisory_comparisons"] = [str(c.get("comparison", {}).get("ratio")) for c in evidence.comparisons]
            if returncode != 0 or facts.problems:
                # correct before fast: a candidate already refused is not timed (its wrong outputs would fail the
                # timing's audit and read as tampering, 12, where they are a quality failure)
                facts.child["judge_timing"] = {"skipped": "the candidate is refused before its speed matters"}
                print("ditgate: the judge does not time the lane: the candidate is already refused", flush=True)
            else:
                facts.comparisons = self.time_lane(facts, out)
                measured = {c["name"] for c in facts.comparisons}
                for name in expected.get("comparisons", []):
                    if name not in measured:
                        facts.problems.append((Category.CRASH, f"required comparison {name} was not measured"))
        else:
            facts.comparisons = judge_timings(evidence, expected.get("comparisons", []),
                                              expected.get("reference_medians", {}), facts.problems)
            if any(str(c.get("mechanism")) not in DEVICE_TIMERS for c in facts.comparisons):
                floor = hold_to_host_floor(facts)
                if floor:
                    facts.child["noise_floor"] = floor
        facts.outputs_seen = sorted({f"{o.get('name')}@{o.get('key')}" for o in evidence.outputs})

    def time_lane(self, facts: Facts, out: Path) -> list[dict[str, Any]]:
        """The judge's own timing of the lane (``rounds.py``): the candidate's tree against a read-only checkout
        of the lane best's commit (for a baseline, of HEAD); the comparisons for the objective."""
        best = facts.best_before
        commit = (best or {}).get("commit") or git.head(self.root)
        folder = out.parent / "timing"
        folder.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        with git.read_only_checkout(self.root, commit, folder) as best_root:
            comparisons, record = time_lane(self.root, best_root, self.root / str(self.lane.timing),
                                            child_env(self.judge_env), folder, facts.arch, self.lane.min_improvement,
                                            facts.problems, experiment_class=facts.effective_class or self.declared)
        record["best_commit"] = git.short(commit)
        record["seconds"] = round(time.perf_counter() - started, 1)
        if any(c.get("device") == "cpu" for c in comparisons):
            floor = hold_to_host_floor(facts)
            if floor:
                record["noise_floor"] = floor
        facts.child["judge_timing"] = record
        print(f"ditgate: the judge timed the lane in {record['seconds']:.1f} s: "
              + "; ".join(f"{c['name']} = {c['ratio']:.4f} (CI {c['ci_low']:.4f}..{c['ci_high']:.4f}, "
                          f"{c['rounds']} rounds)" for c in comparisons), flush=True)
        for name, region in (record.get("regions") or {}).items():
            if region.get("note"):
                print(f"ditgate: judge timing of {name}: {region['note']}", flush=True)
        return comparisons


def hold_to_host_floor(facts: Facts) -> str | None:
    """Hold a gain timed on the host's clock to at least ``HOST_GAIN_FLOOR``: two processes of the same code
    (the best's run and the candidate's, by the judge or each in its own child) read further apart there than
    on a device. The note for the record where the floor was raised, else None."""
    if facts.min_improvement >= HOST_GAIN_FLOOR:
        return None
    facts.min_improvement = HOST_GAIN_FLOOR
    return f"{HOST_GAIN_FLOOR:.0%}: timed on the host"
