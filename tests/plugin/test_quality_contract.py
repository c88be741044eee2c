"""The quality contract is validated on load: every mistake is a usage error naming the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_ditgate.quality.contract import ContractError, contract_from_dict, load_contract
from pytest_ditgate.quality.specs import EXPERIMENT_CLASSES

REPO_CONTRACT = Path(__file__).resolve().parents[2] / "fixtures" / "quality_contract.toml"


def test_repository_contract_covers_every_class() -> None:
    contract = load_contract(REPO_CONTRACT)
    for cls in EXPERIMENT_CLASSES:
        assert contract.rules(cls), cls
    exact = {rule.metric: rule for rule in contract.rules("exact")}
    assert exact["max_ulp"].limit("max", "bf16") == 0  # exact means bitwise by default
    quantization = contract.rules("quantization")
    clip = next(rule for rule in quantization if rule.metric == "clip_score")
    # CLIP and LPIPS need downloaded weights: optional, so that an offline quantization can be judged at all
    assert not clip.required and clip.abs == 0.0 and clip.rel == 0.0 and clip.min == 20.0
    # the learned metrics judge quantization on the trained shapes cases: zero regression within seed noise
    learned = {rule.metric: rule for rule in quantization if rule.applies_to("shapes-ddim-50")
               and rule.spec.needs == "classifier"}
    assert set(learned) == {"class_accuracy", "frechet_distance"}
    assert all(rule.required and rule.noise > 0 for rule in learned.values())
    # detecting quantization never loosens the gate: on the random-weight cases its pixel limits are at most
    # numerical's loosest; on the shapes cases, where pixel limits only catch gross breakage (an honest fp8 moves a
    # guided sample further than bf16 does), its learned metrics allow no more than numerical's
    for rule in quantization:
        if rule.spec.needs == "classifier":
            numerical = next(r for r in contract.rules("numerical") if r.metric == rule.metric and r.cases == rule.cases)
            assert rule.noise <= numerical.limit("abs", "default")
        if rule.spec.pair and rule.metric != "lpips" and rule.applies_to("tiny-ddim-8"):
            numerical = next(r for r in contract.rules("numerical") if r.metric == rule.metric
                             and r.cases == rule.cases)
            key = "min" if rule.min is not None else "max"
            loosest = numerical.limit(key, "default")
            assert (rule.limit(key, "int8") >= loosest) if key == "min" else (rule.limit(key, "int8") <= loosest)


def test_case_patterns_and_second_tables() -> None:
    """``cases`` picks the cases a table judges ("!" excludes); ``<metric>@<label>`` is a second table."""
    contract = contract_from_dict({"metrics": {
        "psnr": {"cases": ["!shapes-*"], "numerical": {"min": 30.0}},
        "psnr@shapes": {"cases": ["shapes-*"], "numerical": {"min": 18.0},
                        "approximate": {"cases": ["shapes-big-*"], "min": 10.0}},
        "class_accuracy": {"cases": ["shapes-*"], "noise": 0.05, "quantization": {}}}}, source="c.toml")
    numerical = contract.rules("numerical")
    assert [(r.metric, r.min) for r in numerical if r.applies_to("xl-ddim-10")] == [("psnr", 30.0)]
    assert [(r.metric, r.min) for r in numerical if r.applies_to("shapes-ddim-20")] == [("psnr", 18.0)]
    approximate = contract.rules("approximate")
    assert [r.applies_to(name) for r in approximate for name in ("shapes-ddim-20", "shapes-big-1")] == [False, True]
    (accuracy,) = contract.rules("quantization")
    assert accuracy.noise == 0.05 and accuracy.abs == 0.0 and accuracy.cases == ("shapes-*",)


@pytest.mark.parametrize("data, expected", [
    ({"metrics": {"psnrr": {"numerical": {"min": 30}}}}, "unknown metric 'metrics.psnrr'; known metrics: psnr"),
    ({"metrics": {"psnr": {"numeric": {"min": 30}}}}, "unknown key metrics.psnr.'numeric'*experiment classes are exact"),
    ({"metrics": {"psnr": {"numerical": {"minimum": 30}}}}, "unknown key metrics.psnr.numerical.'minimum'"),
    ({"metrics": {"psnr": {"direction": "lower", "numerical": {}}}}, "metrics.psnr.direction = 'lower', but psnr is higher"),
    ({"metrics": {"rel_l2": {"numerical": {"min": 0.1}}}}, "metrics.rel_l2.numerical.min: rel_l2 is lower-is-better; bound it with max"),
    ({"metrics": {"ssim": {"numerical": {"abs": 0.1}}}}, "metrics.ssim.numerical.abs: ssim already compares*bound it with min"),
    ({"metrics": {"clip_score": {"quantization": {"abs": 0.5}}}}, "metrics.clip_score.quantization.abs = 0.5: the quantization class allows no regression beyond the metric's measured seed noise*"),
    ({"metrics": {"psnr": {"noise": 0.5, "numerical": {}}}}, "metrics.psnr.noise: psnr compares candidate with baseline; a seed noise applies to score metrics only"),
    ({"metrics": {"class_accuracy": {"noise": -0.1, "numerical": {}}}}, "metrics.class_accuracy.noise must be a finite number >= 0*"),
    ({"metrics": {"class_accuracy": {"cases": "shapes-*", "numerical": {}}}}, "metrics.class_accuracy.cases must be a list of case-name patterns*"),
    ({"metrics": {"psnr@": {"numerical": {}}}}, "unknown metric 'metrics.psnr@'*<metric>@<label>*"),
    ({"metrics": {"psnrr@shapes": {"numerical": {}}}}, "unknown metric 'metrics.psnrr@shapes'*"),
    ({"metrics": {"rel_l2": {"numerical": {"max": {"bf17": 0.1}}}}}, "metrics.rel_l2.numerical.max: unknown dtype key 'bf17'*"),
    ({"metrics": {"rel_l2": {"numerical": {"max": "small"}}}}, "metrics.rel_l2.numerical.max must be a number, got 'small'"),
    ({"metrics": {"psnr": {"kinds": ["latent"], "numerical": {}}}}, "metrics.psnr.kinds: psnr does not apply to 'latent'*"),
    ({"metrics": {"psnr": {"required": "yes", "numerical": {}}}}, "metrics.psnr.required must be true or false"),
    ({"images": {"range": [0, 255]}, "metrics": {"psnr": {}}}, "images.range must be [0.0, 1.0] or [-1.0, 1.0]*"),
    ({"thresholds": {}}, "unknown key 'thresholds'*"),
    ({}, "no [metrics.<name>] tables"),
])
def test_validation_errors_name_file_and_key(data: dict, expected: str) -> None:
    with pytest.raises(ContractError) as info:
        contract_from_dict(data, source="q.toml")
    message = str(info.value)
    assert message.startswith("q.toml: "), message
    position = 0
    for part in expected.split("*"):  # the parts appear in this order
        position = message.index(part, position) + len(part)


def test_dtype_table_without_the_dtype_or_default_is_a_clear_error() -> None:
    contract = contract_from_dict({"metrics": {"rel_l2": {"numerical": {"max": {"fp32": 1e-4}}}}}, source="q.toml")
    rule = contract.rules("numerical")[0]
    assert rule.limit("max", "fp32") == 1e-4
    with pytest.raises(ContractError, match=r"q.toml: metrics.rel_l2.numerical.max has no limit for dtype 'bf16'"):
        rule.limit("max", "bf16")


def test_unparsable_and_missing_files(tmp_path: Path) -> None:
    bad = tmp_path / "c.toml"
    bad.write_text("[metrics.psnr\n")
    with pytest.raises(ContractError, match=r"c.toml: not valid TOML"):
        load_contract(bad)
    with pytest.raises(ContractError, match=r"nope.toml does not exist.*--ditgate-contract"):
        load_contract(tmp_path / "nope.toml")


def test_bad_explicit_contract_fails_the_session_at_start(pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", contract="[metrics.psnr.numerical]\nmin = 30\nmx = 2\n")
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest("--ditgate", "--ditgate-contract=contract.toml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*contract.toml: unknown key metrics.psnr.numerical.'mx'*"])


def test_contract_from_tool_ditgate_and_class_choices(pytester: pytest.Pytester) -> None:
    pytester.makepyprojecttoml('[tool.ditgate]\nquality_contract = "q/contract.toml"\n')
    pytester.mkdir("q")
    pytester.path.joinpath("q", "contract.toml").write_text("[metrics.rel_l2.exact]\nmax = 0\n")
    pytester.makepyfile("""
        def test_x(quality_gate):
            assert quality_gate.contract.path.endswith("contract.toml")
            assert quality_gate.experiment_class == "exact"
    """)
    pytester.runpytest("--ditgate", "--ditgate-class=exact").assert_outcomes(passed=1)
    result = pytester.runpytest("--ditgate", "--ditgate-class=fast")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--ditgate-class: invalid choice: 'fast'*"])


def test_judge_recorded_applies_the_contracts_checks_to_measured_values() -> None:
    """A calibration replays its records through the same checks as a gate: a value under a limit fails,
    one above passes, and a rule with nothing recorded is not judged."""
    from pytest_ditgate.quality.contract import DEFAULT_CONTRACT_PATH
    from pytest_ditgate.quality.evaluate import judge_recorded

    contract = load_contract(DEFAULT_CONTRACT_PATH)

    def only_psnr(value):
        return lambda rule: ("images", value, None) if rule.metric == "psnr" else None

    failed = judge_recorded(only_psnr(20.0), contract=contract, experiment_class="numerical", case="c", dtype="fp32")
    assert not failed.passed and any("images.psnr" in f and "50" in f for f in failed.failures), failed.failures
    passed = judge_recorded(only_psnr(55.0), contract=contract, experiment_class="numerical", case="c", dtype="fp32")
    assert passed.passed and [c.metric for c in passed.checks] == ["images.psnr"]


def test_a_regression_equal_to_its_limit_is_within_it_whatever_its_last_bit() -> None:
    """An accuracy over ten images moves in steps of 0.1, and 0.8 - 0.7 reads 0.10000000000000009: a limit of
    0.1 allows that step (and refuses the next), in every class that bounds a regression."""
    from pytest_ditgate.quality.evaluate import judge_recorded

    contract = contract_from_dict({"metrics": {"class_accuracy": {"noise": 0.1, "numerical": {"abs": 0.1},
                                                                   "quantization": {}}}}, source="c.toml")
    for cls in ("numerical", "quantization"):
        def recorded(value):
            return judge_recorded(lambda rule: ("images", value, 0.8), contract=contract, experiment_class=cls,
                                  case="c", dtype="fp32")

        assert 0.8 - 0.7 > 0.1 and recorded(0.7).passed, cls
        assert not recorded(0.6).passed, cls
