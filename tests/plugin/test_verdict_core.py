"""Pure pieces of the experiment verdict: decision, ledger, scope, classification."""

from __future__ import annotations

import subprocess

import pytest

from pytest_ditgate.verdict import Category, Status, GateOutcome, decide
from pytest_ditgate.verdict.classify import approximation_evidence, classify, quantization_evidence
from pytest_ditgate.verdict.ledger import TSV_COLUMNS, append_experiment, load_best, read_results, store_best
from pytest_ditgate.verdict.scope import matches, scope_problems


def test_all_green_is_keep() -> None:
    verdict = decide([GateOutcome("t::a", "passed"), GateOutcome("t::b", "skipped")])
    assert verdict.status is Status.KEEP and verdict.exit_code == 0 and verdict.label == "keep"


@pytest.mark.parametrize("reason, label, code", [
    ("mismatch", "discard-quality", 10), ("quality", "discard-quality", 10), (None, "discard-quality", 10),
    ("too_slow", "discard-performance", 11), ("timer_tampered", "discard-integrity", 12),
    ("scope", "discard-scope", 13), ("golden_stale", "crash", 15),  # a stale baseline is setup, not the candidate
    ("reference_nonfinite", "crash", 15),  # a broken reference is the gate's bug, not the candidate's
])
def test_failure_reason_decides_category(reason, label, code) -> None:
    verdict = decide([GateOutcome("t::a", "passed"), GateOutcome("t::b", "failed", reason, "boom\nmore")])
    assert (verdict.label, verdict.exit_code) == (label, code)
    assert verdict.reasons[0].startswith("t::b: ")


def test_error_is_crash_and_outranks_discards() -> None:
    verdict = decide([GateOutcome("t::a", "failed", "too_slow"), GateOutcome("t::b", "error", None, "CUDA OOM")])
    assert verdict.status is Status.CRASH and verdict.exit_code == 15
    assert "CRASH" in verdict.headline()


def test_quality_outranks_performance_and_session_problems_count() -> None:
    verdict = decide([GateOutcome("t::a", "failed", "too_slow"), GateOutcome("t::b", "failed", "quality")])
    assert verdict.category is Category.QUALITY
    verdict = decide([], session_problems=[(Category.INTEGRITY, "golden/x.safetensors changed")])
    assert verdict.label == "discard-integrity" and "golden/x" in verdict.headline()


def test_ledger_tsv_and_best(tmp_path) -> None:
    append_experiment(tmp_path, {"status": "keep", "description": "tab\there", "candidate": 1.23456789}, {"x": 1})
    append_experiment(tmp_path, {"status": "discard"}, {"x": 2})
    rows = read_results(tmp_path)
    assert [r["status"] for r in rows] == ["keep", "discard"]
    assert rows[0]["description"] == "tab here" and rows[0]["candidate"] == "1.23457"
    assert (tmp_path / "results.tsv").read_text().splitlines()[0].split("\t") == list(TSV_COLUMNS)
    assert load_best(tmp_path, "fwd", "sm_90") is None
    store_best(tmp_path, "fwd", "sm_90", {"objective": {"ratio": 0.5, "ci_low": 0.4, "ci_high": 0.6}, "samples": [1, 2]})
    assert load_best(tmp_path, "fwd", "sm_90")["samples"] == [1, 2]
    assert load_best(tmp_path, "fwd", "sm_86") is None


def test_a_torn_ledger_row_loses_only_itself(tmp_path) -> None:
    """A writer killed mid-row leaves no newline: the next row was glued onto the torn one, and the summary
    dropped that experiment with it."""
    append_experiment(tmp_path, {"status": "keep", "description": "first"}, {"x": 1})
    with (tmp_path / "results.tsv").open("a") as handle:
        handle.write("2026-12-08T01:00:00\tabc")  # the killed writer's half row
    append_experiment(tmp_path, {"status": "discard-performance", "description": "after the tear"}, {"x": 2})
    skipped: list[str] = []
    rows = read_results(tmp_path, skipped)
    assert [(r["status"], r["description"]) for r in rows] == [("keep", "first"),
                                                               ("discard-performance", "after the tear")]
    assert skipped and "(3)" in skipped[0]  # the torn row, named; never guessed at


@pytest.mark.parametrize(("text", "problem"), [
    ("{half", "not valid JSON"),
    ("{}", "no 'objective' object"),
    ('{"objective": {"ratio": 0.5, "ci_low": 0.4}}', "objective.ci_high must be a positive finite number, found None"),
    ('{"objective": {"ratio": "fast", "ci_low": 0.4, "ci_high": 0.6}}', "objective.ratio must be a positive finite"),
    ('{"objective": {"ratio": NaN, "ci_low": 0.4, "ci_high": 0.6}}', "objective.ratio must be a positive finite"),
    ('{"objective": {"ratio": 0.5, "ci_low": 0.4, "ci_high": 0.6}, "comparisons": 3}', "'comparisons' must be a list"),
])
def test_corrupt_best_is_reported(tmp_path, text: str, problem: str) -> None:
    path = store_best(tmp_path, "fwd", "cpu", {"objective": {"ratio": 0.5, "ci_low": 0.4, "ci_high": 0.6}})
    path.write_text(text)
    with pytest.raises(ValueError) as info:
        load_best(tmp_path, "fwd", "cpu")
    assert str(path) in str(info.value) and problem in str(info.value) and "remove it" in str(info.value)


def test_scope(tmp_path) -> None:
    """Fixed paths and paths outside the mutable ones are named (the judge diffs against the lane's anchors)."""
    from pytest_ditgate import git

    def run(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    run("init", "-q")
    run("config", "user.email", "t@example.com")
    run("config", "user.name", "t")
    (tmp_path / "dit_impl").mkdir()
    (tmp_path / "dit_impl" / "fast.py").write_text("a = 1\n")
    (tmp_path / "golden").mkdir()
    (tmp_path / "golden" / "g.bin").write_text("g")
    run("add", "-A")
    run("commit", "-qm", "base")
    anchor = git.head(tmp_path)
    (tmp_path / "dit_impl" / "fast.py").write_text("a = 2\n")
    (tmp_path / "golden" / "g.bin").write_text("h")
    (tmp_path / "notes.txt").write_text("new")
    run("add", "dit_impl/fast.py")
    run("commit", "-qm", "one")
    run("commit", "-qm", "two", "--allow-empty")  # HEAD^ would see nothing: the anchor sees everything
    changed = git.changed_since(tmp_path, anchor)
    assert changed == ["dit_impl/fast.py", "golden/g.bin", "notes.txt"]
    problems = scope_problems(changed, mutable=["dit_impl/"], fixed=["golden/"])
    assert problems == [(Category.INTEGRITY, "golden/g.bin: a fixed path, changed since the lane's anchors"),
                        (Category.SCOPE, "notes.txt: outside the mutable paths (dit_impl/)")]
    # no mutable path declared: nothing is mutable (the judge's rule, now the only one)
    assert scope_problems(["dit_impl/fast.py"], mutable=[], fixed=[]) == [
        (Category.SCOPE, "dit_impl/fast.py: outside the mutable paths (none declared)")]


def test_scope_patterns() -> None:
    assert matches("dit_impl/fast/x.py", "dit_impl/") and not matches("dit_implx/y.py", "dit_impl/")
    assert matches("a/b/conftest.py", "**/conftest.py") and matches("conftest.py", "**/conftest.py")
    assert matches("kernels/lane.py", "kernels/*.py") and matches("kernels/sub/x.py", "kernels")
    assert not matches("pyproject.toml", "pyproject.toml#tool.ditgate")  # the lock judges a table


def test_classification_is_checked_not_trusted() -> None:
    torch = pytest.importorskip("torch")
    honest = torch.nn.Linear(4, 4)
    assert quantization_evidence([honest]) == []
    cheat = torch.nn.Linear(4, 4)
    cheat.register_buffer("w_int8", torch.full((4, 4), -3, dtype=torch.int8))
    honest.register_buffer("mask", torch.ones(4, 4, dtype=torch.uint8))  # a 0/1 mask is not quantization
    assert quantization_evidence([honest]) == []
    evidence = quantization_evidence([cheat])
    assert evidence == ["tensor w_int8 has dtype int8"]
    assert classify("numerical", quantization=evidence).effective == "quantization"
    fp8 = {"w": torch.zeros(2, dtype=torch.float8_e4m3fn)}
    assert quantization_evidence(state_dicts=[fp8]) == ["weight w has dtype float8_e4m3fn"]
    approx = approximation_evidence({"num_steps": 25, "scheduler": "ddim"}, {"num_steps": 50, "scheduler": "ddim"})
    assert approx == ["num_steps 50 -> 25"]
    assert classify("exact", approximation=approx).effective == "approximate"
    assert classify("quantization").effective == "quantization"  # a stricter claim stands
    with pytest.raises(ValueError):
        classify("magic")


def test_what_a_sampling_executed_is_approximation_evidence() -> None:
    """Beyond the usual settings, every key both sides state counts: what a gate suite recorded as executed
    (timesteps, guided calls, blocks per call) against what the frozen case executes."""
    frozen = {"num_steps": 8, "timesteps": [875, 750, 625], "guided_calls": 8, "blocks_per_call": 28}
    assert approximation_evidence(dict(frozen), frozen) == []
    cut = approximation_evidence({**frozen, "guided_calls": 4, "blocks_per_call": 14}, frozen)
    assert cut == ["blocks_per_call 28 -> 14", "guided_calls 8 -> 4"]
    long = approximation_evidence({**frozen, "timesteps": list(range(900, 0, -25))}, frozen)
    assert long[0].startswith("timesteps [875, 750, 625] -> [900, 875,") and long[0].endswith("...")
    assert len(long[0]) < 150
    assert approximation_evidence({"seed": 1}, {"steps": 2}) == []  # a key one side lacks is no evidence
    assert classify("numerical", approximation=cut).effective == "approximate"


def test_remeasured_best_decides_over_the_recorded_ratio() -> None:
    from pytest_ditgate.verdict.objective import beats_best, combine

    objective = {"ratio": 0.50, "ci_low": 0.48, "ci_high": 0.52}
    lucky_best = {"objective": {"ratio": 0.45}, "commit": "abc"}
    # against the lucky recorded ratio the candidate loses ...
    assert beats_best(objective, lucky_best)[0] is False
    # ... but measured side by side in this run it is clearly faster than the best's configuration
    remeasured = combine([{"ratio": 0.9, "ci_low": 0.88, "ci_high": 0.92}])
    ok, why = beats_best(objective, lucky_best, remeasured=remeasured)
    assert ok and "re-measured lane best = 0.9000" in why
    slower = combine([{"ratio": 1.01, "ci_low": 0.97, "ci_high": 1.05}])
    assert beats_best(objective, lucky_best, remeasured=slower)[0] is False
    assert beats_best(objective, None)[0] is True


def test_same_code_drift_does_not_beat_the_best_under_the_lane_noise_floor() -> None:
    """An empty commit once measured 0.983 (CI 0.970..0.995) against its re-measured best on a drifting host
    clock: a 0 floor kept it as a new best; the lane's default 2 % floor does not, and a real speedup still wins."""
    from pytest_ditgate.verdict.lane import DEFAULT_MIN_IMPROVEMENT
    from pytest_ditgate.verdict.objective import beats_best, combine

    objective = {"ratio": 0.32, "ci_low": 0.31, "ci_high": 0.33}
    best = {"objective": {"ratio": 0.33}, "commit": "abc"}
    drift = combine([{"ratio": 0.9832, "ci_low": 0.9702, "ci_high": 0.9952}])
    assert beats_best(objective, best, remeasured=drift)[0] is True  # what a 0 floor did
    kept, why = beats_best(objective, best, min_improvement=DEFAULT_MIN_IMPROVEMENT, remeasured=drift)
    assert not kept and why.startswith("not faster than the lane best")
    faster = combine([{"ratio": 0.90, "ci_low": 0.88, "ci_high": 0.92}])
    assert beats_best(objective, best, min_improvement=DEFAULT_MIN_IMPROVEMENT, remeasured=faster)[0] is True


@pytest.mark.parametrize("value, error", [(None, None), (0.0, None), (0.05, None), (-0.01, "min_improvement"),
                                          (0.5, "min_improvement"), (True, "min_improvement"), ("2%", "min_improvement")])
def test_lane_min_improvement_is_validated(value, error) -> None:
    from pytest_ditgate.errors import DitgateUsageError
    from pytest_ditgate.verdict.lane import DEFAULT_MIN_IMPROVEMENT, load_lane

    table = {"tests": ["tests/gates"]} | ({} if value is None else {"min_improvement": value})
    project = {"lanes": {"fwd": table}}
    if error:
        with pytest.raises(DitgateUsageError, match=r"\[tool.ditgate.lanes.fwd\] min_improvement must be"):
            load_lane(project, "fwd")
    else:
        assert load_lane(project, "fwd").min_improvement == (DEFAULT_MIN_IMPROVEMENT if value is None else value)


def test_advisory_runs_use_the_lane_floor_unless_the_option_says_otherwise() -> None:
    from pytest_ditgate.verdict.plugin import _min_improvement

    project = {"lanes": {"fwd": {"tests": ["t"], "min_improvement": 0.05}}}
    assert _min_improvement(None, project, "fwd") == 0.05
    assert _min_improvement(0.0, project, "fwd") == 0.0
    assert _min_improvement(None, project, "other") == 0.02 and _min_improvement(None, {}, None) == 0.02
    with pytest.raises(pytest.UsageError, match="min_improvement must be"):  # as the judge would refuse it
        _min_improvement(None, {"lanes": {"fwd": {"tests": ["t"], "min_improvement": "2%"}}}, "fwd")


def _softmax_best(reference_ms: float, mechanism: str = "wall") -> dict:
    """The softmax lane's best as its baseline recorded it: the ratio, and the reference's median in that run."""
    return {"objective": {"ratio": 0.0771, "ci_low": 0.0761, "ci_high": 0.0779}, "commit": "abc",
            "comparisons": [{"name": "tests/gates/test_gate.py::test_speed", "mechanism": mechanism,
                             "reference_median_ms": reference_ms, "ratio": 0.0771}]}


def _softmax_run(ratio: float, reference_ms: float, mechanism: str = "wall") -> dict:
    return {"name": "tests/gates/test_gate.py::test_speed", "mechanism": mechanism, "ratio": ratio,
            "ci_low": ratio * 0.985, "ci_high": ratio * 1.01, "reference_median_ms": reference_ms}


#: the judge's host floor (``experiment.rounds.HOST_GAIN_FLOOR``; the pure core's tests reach nothing of the judge)
HOST_GAIN_FLOOR = 0.15


def test_a_recorded_best_measured_under_other_load_needs_a_gain_beyond_the_hosts_drift() -> None:
    """CI kept an empty commit of the softmax lane at 0.0621 (CI high 0.0626) against its best's 0.0771 (CI low
    0.0761), past the 15 % host floor: its reference ran about 224 us (the candidate's 13.9 us / 0.0621) where
    the same code runs about 172 us on a quiet two-core host. The reference is the same code in both runs, so its
    drift bounds what load did to the ratio (``benchmarks/host_drift.py``); a real 2x gain still wins."""
    from pytest_ditgate.verdict.evaluate import Evidence, evaluate
    from pytest_ditgate.verdict.objective import host_drift, judge_objective

    best = _softmax_best(0.172)
    same_code = _softmax_run(0.0621, 0.224)
    assert host_drift([same_code], best) == pytest.approx(0.224 / 0.172)
    objective, why = judge_objective([same_code], best, min_improvement=HOST_GAIN_FLOOR)
    assert why is not None and why.startswith("not faster than the lane best: ratio 0.0621")
    assert "the fixed reference's time here is 1.30x off its time in the best's run" in why
    assert "a versus-lane-best pair" in why  # what fixes it for good
    verdict = evaluate(Evidence(comparisons=[same_code], lane="fwd", best=best, min_improvement=HOST_GAIN_FLOOR,
                                declared_class="exact")).verdict
    assert verdict.exit_code == 11
    # a real speedup measured under the same load still wins: 2x beyond the drift and the floor
    assert judge_objective([_softmax_run(0.0621 / 2, 0.224)], best, min_improvement=HOST_GAIN_FLOOR)[1] is None
    # a host that ran faster than in the best's run is as far off (a candidate's threads gain more when quiet)
    assert host_drift([_softmax_run(0.0621, 0.172 / 1.3)], best) == pytest.approx(1.3)
    # on the host as loaded as in the best's run, the floor alone decides, as before
    assert judge_objective([_softmax_run(0.0621, 0.173)], best, min_improvement=HOST_GAIN_FLOOR)[1] is None


def test_host_drift_ignores_device_timers_re_measured_pairs_and_unmatched_names() -> None:
    """A device timer's reference is bounded by its own drift check (2x the baseline's); a pair against the
    re-measured best needs no drift; a comparison the best never ran, or a best recorded without medians, has
    nothing to compare with: each reads 1.0, and the floor alone decides."""
    from pytest_ditgate.verdict.objective import host_drift

    best = _softmax_best(0.172)
    assert host_drift([_softmax_run(0.0621, 0.224, mechanism="events")], best) == 1.0
    assert host_drift([_softmax_run(0.0621, 0.224)], _softmax_best(0.172, mechanism="cupti")) == 1.0
    versus = {**_softmax_run(0.9, 0.5), "name": "tests/gates/test_gate.py::test_speed / lane-best"}
    assert host_drift([versus], best) == 1.0
    assert host_drift([{**_softmax_run(0.0621, 0.224), "name": "other"}], best) == 1.0
    assert host_drift([_softmax_run(0.0621, 0.224)], {"objective": {"ratio": 0.0771}}) == 1.0
    assert host_drift([_softmax_run(0.0621, float("nan"))], best) == 1.0
    assert host_drift([_softmax_run(0.0621, 0.224)], None) == 1.0
    # two comparisons combine as the objective does: the geometric mean of their factors
    two = _softmax_best(0.172)
    two["comparisons"].append({**two["comparisons"][0], "name": "b", "reference_median_ms": 0.1})
    assert host_drift([_softmax_run(0.06, 0.172 * 1.44), {**_softmax_run(0.06, 0.1), "name": "b"}], two) == \
        pytest.approx(1.2)


def test_an_advisory_run_weighs_the_hosts_drift_as_the_judge_does() -> None:
    """An advisory ``--ditgate-lane`` run's report row names the pair and its test apart, and labels a busy timer
    ``cupti: kernel time only``; it is matched with the judge's recorded best all the same, so that an advisory
    KEEP is not a judged DISCARD."""
    from pytest_ditgate.bench.comparison import compare
    from pytest_ditgate.bench.measurement import Measurement
    from pytest_ditgate.bench.report import comparison_row
    from pytest_ditgate.verdict.objective import host_drift

    best = _softmax_best(0.172)
    best["comparisons"][0]["name"] = "tests/gates/test_gate.py::test_speed::candidate / reference"

    def wall(label: str, median_ms: float) -> Measurement:
        samples = [median_ms * (1 + 0.001 * (i % 5 - 2)) for i in range(40)]
        return Measurement.from_samples(samples, warmup=3, mechanism="wall", regime="spaced", l2_mode="warm",
                                        label=label)

    pair = compare(wall("candidate", 0.0139), wall("reference", 0.224), method="paired-bootstrap")
    row = comparison_row("tests/gates/test_gate.py::test_speed", pair, None, None)
    assert row["name"] == "candidate / reference" and row["reference_median_ms"] == pytest.approx(0.224)
    assert host_drift([row], best) == pytest.approx(0.224 / 0.172)
    busy = dict(row, mechanism="cupti: kernel time only")
    assert host_drift([busy], best) == 1.0  # a device timer: its own drift bound applies
