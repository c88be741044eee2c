"""Reading what the child left in its output folder, and judging it with fixed code only.

Outputs are compared with the goldens under the quality contract *here*; the timing ratios are derived
here from the raw samples; the child's own pass/fail reports can only add failures.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pytest_ditgate.bench.mechanisms import DEVICE_TIMERS
from pytest_ditgate.fsutil import read_jsonl
from pytest_ditgate.golden.keys import device_of
from pytest_ditgate.golden.names import match_names
from pytest_ditgate.golden.quality_inputs import for_tensors, frozen_record
from pytest_ditgate.numbers import finite_number
from pytest_ditgate.verdict.lane import LANE_BEST_LABEL
from pytest_ditgate.verdict.outcome import Category, GateOutcome
from pytest_ditgate.verdict.reports import OutcomeBook

#: a reference (fixed code) whose median time grew by more than this factor since the baseline run makes
#: the run's ratios worthless as a speed claim: slowed from inside the candidate's process (the ratio would
#: flatter the candidate), or an honest run on a loaded host (an eager XL forward is launch-bound: on the
#: H200 its diffusers reference can read 80 ms against 29 ms at the baseline, on an empty commit). The two
#: cannot be told apart from the samples, so it is a performance DISCARD (no KEEP, no accusation). Checked
#: for device timers only: a host's wall clock under load varies by more than that on its own
REFERENCE_DRIFT = 2.0
MIN_SAMPLES = 5


@dataclass
class ChildEvidence:
    out: Path
    outcomes: dict[str, GateOutcome] = field(default_factory=dict)
    ran: set[str] = field(default_factory=set)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    comparisons: list[dict[str, Any]] = field(default_factory=list)
    observed: dict[str, Any] = field(default_factory=dict)
    skipped_lines: int = 0
    #: tests the child left out because the judge times the lane itself
    timed_by_judge: list[str] = field(default_factory=list)


def read_child(out: Path) -> ChildEvidence:
    """Everything the child wrote (unparsable lines are counted, never trusted)."""
    import json

    from pytest_ditgate.bench.ledger import Ledger
    from pytest_ditgate.judged_run import CLASS, OUTPUTS, TESTS, TIMED_BY_JUDGE

    evidence = ChildEvidence(out)
    tests, bad = read_jsonl(out / TESTS)
    evidence.skipped_lines += len(bad)
    book = OutcomeBook(evidence.outcomes, evidence.ran)  # the advisory run's rule, over the child's lines
    for report in tests:
        reason = report.get("reason")
        book.add(str(report.get("nodeid")), report.get("when"), report.get("outcome"),
                 str(reason) if reason else None, str(report.get("message", "")))
    evidence.outputs, bad = read_jsonl(out / OUTPUTS)
    evidence.skipped_lines += len(bad)
    records, bad = Ledger(out / "artefacts" / "bench.jsonl").read()
    evidence.skipped_lines += len(bad)
    evidence.comparisons = [r for r in records if r.get("kind") == "comparison"]
    try:
        evidence.observed = json.loads((out / CLASS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        evidence.observed = {}
    try:
        left_out = json.loads((out / TIMED_BY_JUDGE).read_text(encoding="utf-8"))
        evidence.timed_by_judge = [str(n) for n in left_out] if isinstance(left_out, list) else []
    except (OSError, ValueError):
        pass
    return evidence


def comparison_name(record: dict[str, Any]) -> str:
    c = record.get("comparison", {})
    return f"{record.get('test')}::{c.get('a', {}).get('label')} / {c.get('b', {}).get('label')}"


def rederive(record: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """The comparison re-derived from its raw samples, or a reason it cannot be trusted."""
    from pytest_ditgate.bench.stats import ratio_interval

    c = record.get("comparison", {})
    name = comparison_name(record)
    a, b = c.get("a", {}).get("samples_ms") or [], c.get("b", {}).get("samples_ms") or []
    for side, samples in (("candidate", a), ("reference", b)):
        if len(samples) < MIN_SAMPLES or not all(finite_number(x) and x > 0 for x in samples):
            return None, f"{name}: {side} timing samples are missing, too few or not positive finite numbers"
    try:
        interval = ratio_interval(a, b, method=str(c.get("method", "bootstrap")),
                                  confidence=float(c.get("confidence", 0.95)))
    except (ValueError, TypeError) as exc:
        return None, f"{name}: cannot re-derive the ratio ({exc})"
    reported = float(c.get("ratio", float("nan")))
    if not math.isclose(reported, interval.ratio, rel_tol=1e-6):
        return None, f"{name}: reported ratio {reported:.6g} is not the ratio of its samples ({interval.ratio:.6g})"
    median_b = sorted(b)[len(b) // 2]
    return {"name": name, "test": record.get("test"), "ratio": interval.ratio, "ci_low": interval.low,
            "ci_high": interval.high, "method": interval.method, "mechanism": c.get("a", {}).get("mechanism"),
            "arch": c.get("a", {}).get("arch"), "reference_median_ms": median_b,
            "versus_best": name.endswith(f"/ {LANE_BEST_LABEL}")}, None


def judge_timings(evidence: ChildEvidence, expected: list[str], reference_medians: dict[str, float],
                  problems: list[tuple[Category, str]]) -> list[dict[str, Any]]:
    """Re-derived comparisons (the latest per name); problems for untrusted or missing ones."""
    latest: dict[str, dict[str, Any]] = {}
    untrusted = set()
    for record in evidence.comparisons:
        derived, why = rederive(record)
        if why:
            problems.append((Category.INTEGRITY, why))
            untrusted.add(comparison_name(record))
            continue
        latest[derived["name"]] = derived
    for name in expected:
        if name not in latest and name not in untrusted and not _refused_as_wrong(evidence, name):
            problems.append((Category.CRASH, f"required comparison {name} was not measured"))
    for name, derived in latest.items():
        recorded = reference_medians.get(name)
        if recorded and str(derived.get("mechanism")) in DEVICE_TIMERS and derived["reference_median_ms"] > REFERENCE_DRIFT * recorded:
            problems.append((Category.PERFORMANCE, f"{name}: the reference took {derived['reference_median_ms']:.4g} ms, "
                                                   f"{derived['reference_median_ms'] / recorded:.2f}x its baseline "
                                                   f"{recorded:.4g} ms: a measurement this far off supports no speed "
                                                   "claim (a loaded or throttled machine, or the candidate's process "
                                                   "slowing the reference down); re-run on a quiet machine"))
    return list(latest.values())


def _refused_as_wrong(evidence: ChildEvidence, name: str) -> bool:
    """Whether the test that measures comparison ``name`` failed for a quality reason (correct before fast:
    ``ditbench.pair`` times nothing whose outputs are wrong); that failure is then the verdict's reason."""
    outcome = evidence.outcomes.get(name.rsplit("::", 1)[0])
    return outcome is not None and outcome.category is Category.QUALITY


def judge_outputs(root: Path, evidence: ChildEvidence, expected: list[str], experiment_class: str,
                  contract: Path, arch: str, problems: list[tuple[Category, str]]) -> list[dict[str, Any]]:
    """Compare every output with its golden here; quality records for the verdict."""
    from safetensors.torch import load_file

    from pytest_ditgate.errors import DitgateUsageError, GateFailure
    from pytest_ditgate.golden.session import GoldenSession
    from pytest_ditgate.golden.store import GoldenStore

    session = GoldenSession(GoldenStore(root / "golden"), mode="check")
    models = _project_models(root)  # one classifier for every output
    quality = []
    seen = set()
    for record in evidence.outputs:
        name, key = str(record.get("name")), str(record.get("key"))
        label = f"{name}@{key}"
        seen.add(label)
        if _device_or_none(key) not in ("cpu", arch):
            problems.append((Category.INTEGRITY, f"output {label}: device key {key!r} is neither cpu nor this device"))
            continue
        try:
            path = (evidence.out / str(record.get("file"))).resolve()
            if evidence.out.resolve() not in path.parents:
                raise ValueError("outside the output folder")
            candidate = load_file(str(path))
            hit = session.lookup(name, key)
        except GateFailure as exc:
            category = Category.INTEGRITY if exc.reason == "golden_integrity" else Category.QUALITY
            problems.append((category, f"output {label}: [{exc.reason}] {exc.message.splitlines()[0]}"))
            continue
        except Exception as exc:  # a malformed output file is the candidate's crash, not a pass
            problems.append((Category.CRASH, f"output {label}: unreadable ({type(exc).__name__}: {exc})"))
            continue
        matched = match_names(hit.tensors, candidate, record.get("optional") or ())  # the test's own rule
        if not matched.ok:
            problems.append((Category.QUALITY, f"output {label}: " + "; ".join(matched.failures())))
            continue
        shared = {k: candidate[k] for k in matched.shared}
        hit = replace(hit, tensors={k: t for k, t in hit.tensors.items() if k in shared})
        try:
            passed, lines, metrics, structural = _compare(shared, hit, experiment_class, contract, name,
                                                          {**_quality_inputs(hit.entry, shared, models),
                                                           "compute_dtype": _tf32_dtype(evidence, shared, key)})
        except DitgateUsageError as exc:  # a golden or setup the contract cannot read (a candidate's bad tensors
            problems.append((Category.CRASH, f"output {label}: cannot be judged: {exc}"))  # are quality failures)
            continue
        quality.append({"case": name, "key": key, "test": record.get("test"), "passed": passed, "metrics": metrics,
                        **({"judged_on": structural} if structural else {})})
        if not passed:
            problems.append((Category.QUALITY, f"output {label} fails its golden under class {experiment_class}: "
                                               + "; ".join(lines[:3])))
    produced = {_device_label(label) for label in seen}
    for label in expected:
        if label not in seen and _device_label(label) not in produced:
            problems.append((Category.CRASH, f"required output {label} was not produced"))
    return quality


def _device_label(label: str) -> str:
    """``name@device`` of ``name@key``: an output checked under this machine's key (``cpu.0f9e8d7c``, for an
    ``exact`` claim) and one checked under the device's key (``cpu``) stand for the same required output,
    since a suite checks the one its class needs (the baseline run freezes both)."""
    name, _, key = label.rpartition("@")
    device = _device_or_none(key)
    return label if device is None else f"{name}@{device}"


def _device_or_none(key: str) -> str | None:
    """The device a (machine) key names, or None for text that is no key (the child wrote it)."""
    try:
        return device_of(key)
    except ValueError:
        return None


def _project_models(root: Path) -> Any:
    """The project's perceptual models (its ``[tool.ditgate]`` weights and classifier, as the child's quality
    session reads them), loaded on first use."""
    from pytest_ditgate.project_config import load_project_config
    from pytest_ditgate.quality.perceptual import PerceptualModels, WeightsConfig

    return PerceptualModels(WeightsConfig.from_settings(root, load_project_config(root)))


def _quality_inputs(entry: Any, shared: dict[str, Any], models: Any) -> dict[str, Any]:
    """``kinds`` (of the tensors judged) and ``labels`` frozen with the golden: the judge judges as the test's
    ``compare`` did, and never by what the candidate's process wrote beside its outputs."""
    return {**for_tensors(frozen_record(entry.provenance), shared), "models": models}


def _tf32_dtype(evidence: ChildEvidence, tensors: dict[str, Any], key: str) -> str | None:
    """``tf32`` when the candidate's process ran float32 GEMMs on a GPU with TF32 allowed and these outputs,
    checked under a GPU's key, are float32: they are judged at TF32's limits, by what executed (None: by the
    outputs' own dtype; a CPU output never ran TF32)."""
    import torch

    ran = evidence.observed.get("tf32_gemms")
    if not (isinstance(ran, int) and ran > 0) or _device_or_none(key) in (None, "cpu"):
        return None
    return "tf32" if all(t.dtype == torch.float32 for t in tensors.values()) else None


def _compare(candidate: dict[str, Any], hit: Any, experiment_class: str, contract: Path,
             case: str, inputs: dict[str, Any]) -> tuple[bool, list[str], dict[str, Any], str | None]:
    """The child's quality judgement, made again here: the contract the child's session reads
    (``Judge.contract``, the packaged default where the project has none). The last item says why no metric
    judged the case (the contract's ``[structural]`` table), or None."""
    from pytest_ditgate.quality.evaluate import evaluate_quality

    result = evaluate_quality(candidate, hit.tensors, contract=contract, experiment_class=experiment_class, case=case,
                              tolerance_scale=hit.tolerance_scale, **inputs)
    return (bool(result.passed), list(result.failures) or [result.summary()], dict(result.metrics),
            result.structural)


def required_ran(evidence: ChildEvidence, required: tuple[str, ...]) -> list[str]:
    """Problems when none of the lane's tests ran, or a required pattern matched no test that ran (a test the
    child left out because the judge times the lane itself counts as run: the judge's timing stands for it)."""
    if not evidence.ran:
        return ["no test of the lane ran (collected none, skipped all, or the session stopped)"]
    ran = evidence.ran | set(evidence.timed_by_judge)
    return [f"required test {pattern!r} did not run" for pattern in required
            if not any(fnmatch.fnmatch(nodeid, pattern) for nodeid in ran)]
