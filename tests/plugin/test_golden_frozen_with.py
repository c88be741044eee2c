"""``frozen_with``: a golden frozen for other inputs (new weights, another seed) fails as stale, naming the key
and both values, not as a mismatch of the tensors; keys left out may differ (a bf16 run against an fp32 golden)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("safetensors")

from pytest_ditgate.golden.frozen_with import disagreement  # noqa: E402

TESTS = """
import torch

def test_case(golden):
    g = torch.Generator().manual_seed({seed})
    golden.check("case", {{"latents": torch.randn(2, 3, 8, 8, generator=g)}}, metadata={metadata},
                 frozen_with={frozen_with})
"""
FROZEN = {"weights": "shipped:shapes@50a27401d8d5", "seed": 5, "class_labels": [0, 1], "dtype": "float32"}


def run(pytester: pytest.Pytester, metadata: dict, *args: str, seed: int = 0,
        frozen_with: tuple[str, ...] = ("weights", "seed", "class_labels")) -> pytest.RunResult:
    pytester.makepyfile(test_frozen_with=TESTS.format(seed=seed, metadata=repr(metadata),
                                                      frozen_with=repr(frozen_with)))
    return pytester.runpytest("--ditgate", "-p", "no:cacheprovider", *args)


def manifest(pytester: pytest.Pytester) -> bytes:
    return (pytester.path / "golden" / "manifest.json").read_bytes()


def test_a_golden_frozen_for_other_weights_is_stale_not_a_mismatch(pytester: pytest.Pytester) -> None:
    run(pytester, FROZEN, "--ditgate-freeze").assert_outcomes(passed=1)
    before = manifest(pytester)
    retrained = {**FROZEN, "weights": "shipped:shapes@9c1f00aa0b7e"}
    result = run(pytester, retrained, seed=1)  # new weights give other tensors too: stale says why
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(['*[[]golden_stale[]] golden \'case\' for cpu was frozen for other inputs than this '
                                 'test gives (weights: "shipped:shapes@9c1f00aa0b7e" here, '
                                 '"shipped:shapes@50a27401d8d5" in the golden): it is not this test\'s baseline, '
                                 'and a judge would judge by the frozen ones; refreeze it*'])
    assert "golden_mismatch" not in result.stdout.str()
    assert manifest(pytester) == before  # a check writes nothing
    run(pytester, retrained, "--ditgate-refreeze", seed=1).assert_outcomes(passed=1)
    run(pytester, retrained, seed=1).assert_outcomes(passed=1)


def test_every_changed_input_is_named(pytester: pytest.Pytester) -> None:
    run(pytester, FROZEN, "--ditgate-freeze").assert_outcomes(passed=1)
    result = run(pytester, {**FROZEN, "seed": 6, "class_labels": (0, 2)})
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*(seed: 6 here, 5 in the golden; class_labels: [[]0, 2] here, [[]0, 1] in the golden)*"])


def test_a_key_left_out_may_differ(pytester: pytest.Pytester) -> None:
    """dtype is not named: a bf16 run is judged against the fp32 golden by its tensors alone."""
    run(pytester, FROZEN, "--ditgate-freeze").assert_outcomes(passed=1)
    run(pytester, {**FROZEN, "dtype": "bfloat16"}).assert_outcomes(passed=1)
    result = run(pytester, {**FROZEN, "dtype": "bfloat16"}, seed=1)  # and a real difference is still a mismatch
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*[[]golden_mismatch[]]*"])


def test_equal_values_after_the_manifests_json_pass(pytester: pytest.Pytester) -> None:
    """A tuple given is the list the manifest holds; the same inputs are not stale."""
    run(pytester, FROZEN, "--ditgate-freeze").assert_outcomes(passed=1)
    run(pytester, {**FROZEN, "class_labels": (0, 1)}).assert_outcomes(passed=1)
    entry = json.loads(manifest(pytester))["entries"]["cpu/case"]
    assert entry["provenance"]["metadata"]["weights"] == FROZEN["weights"]


def test_a_key_named_but_not_given_is_the_tests_error(pytester: pytest.Pytester) -> None:
    for mode in ("--ditgate-freeze", "--ditgate-refreeze"):
        result = run(pytester, {"seed": 5}, mode)
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(["*ValueError: golden 'case': frozen_with names weights, class_labels, which "
                                     "metadata does not give*"])
    assert not (pytester.path / "golden" / "manifest.json").exists()


def test_a_golden_frozen_before_a_key_existed_is_judged_by_its_tensors() -> None:
    assert disagreement({"weights": "b", "seed": 5}, {"seed": 5}, ("weights", "seed")) is None
    assert disagreement({"weights": "b"}, {"weights": "a"}, ()) is None
    assert disagreement({"weights": "b"}, {"weights": "a"}, ("weights",)) == 'weights: "b" here, "a" in the golden'


BOTH_CHANGED = """
import torch

def test_case(golden):
    golden.check("case", {{"latents": torch.zeros(2, 3, 8, 8)}}, metadata={{"weights": {weights!r}}},
                 frozen_with=("weights",), quality_inputs={{"labels": {labels!r}}})
"""


def test_other_weights_and_other_quality_inputs_are_named_in_one_failure(pytester: pytest.Pytester) -> None:
    """A check that differs from its golden in metadata and in quality inputs says both at once, so one
    refreeze (or one fix) settles it."""
    pytester.makepyfile(test_both=BOTH_CHANGED.format(weights="random(seed=1)", labels=[3, 7]))
    pytester.runpytest("--ditgate", "-p", "no:cacheprovider", "--ditgate-freeze").assert_outcomes(passed=1)
    pytester.makepyfile(test_both=BOTH_CHANGED.format(weights="random(seed=2)", labels=[3, 8]))
    result = pytester.runpytest("--ditgate", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(['*[[]golden_stale[]]*(weights: "random(seed=2)" here, "random(seed=1)" in the golden; '
                                 'labels: 2 [[]3, 8] here, 2 [[]3, 7] in the golden)*'])
