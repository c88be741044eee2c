"""Quality inputs frozen with a golden: a freeze stores the kinds and labels its test judges with, a check
whose test gives others fails as stale (the judge, out of process, would judge by the frozen ones)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("safetensors")

from pytest_ditgate.golden.quality_inputs import disagreement, for_tensors, frozen_record, quality_record  # noqa: E402

TESTS = """
import torch

def tensors():
    g = torch.Generator().manual_seed(0)
    return {{"latents": torch.randn(2, 3, 8, 8, generator=g) * 3, "images": torch.rand(2, 3, 8, 8, generator=g)}}

def test_case(golden):
    golden.check("case", tensors(), quality_inputs={inputs})
"""
FROZEN = {"kinds": {"latents": "latent"}, "labels": [3, 7]}


def run(pytester: pytest.Pytester, inputs: object, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_quality_inputs=TESTS.format(inputs=repr(inputs)))
    return pytester.runpytest("--ditgate", "-p", "no:cacheprovider", *args)


def frozen_entry(pytester: pytest.Pytester) -> dict:
    return json.loads((pytester.path / "golden" / "manifest.json").read_text())["entries"]["cpu/case"]


def test_a_freeze_stores_the_quality_inputs_in_the_entrys_provenance(pytester: pytest.Pytester) -> None:
    run(pytester, {**FROZEN, "models": None}, "--ditgate-freeze").assert_outcomes(passed=1)
    assert frozen_entry(pytester)["provenance"]["quality"] == FROZEN  # plain data only: no models
    run(pytester, FROZEN).assert_outcomes(passed=1)


def test_a_golden_frozen_without_quality_inputs_records_none(pytester: pytest.Pytester) -> None:
    run(pytester, None, "--ditgate-freeze").assert_outcomes(passed=1)
    assert "quality" not in frozen_entry(pytester)["provenance"]
    run(pytester, None).assert_outcomes(passed=1)


@pytest.mark.parametrize(("frozen", "given", "shown"), [
    (FROZEN, {"kinds": {"latents": "latent", "images": "latent"}, "labels": [3, 7]},
     "images: latent here, unset in the golden"),
    (FROZEN, {"kinds": {"latents": "latent"}, "labels": [3, 8]}, "labels: 2 [3, 8] here, 2 [3, 7] in the golden"),
    (FROZEN, None, "latents: unset here, latent in the golden; labels: none here, 2 [3, 7] in the golden"),
    (None, FROZEN, "latents: latent here, unset in the golden; labels: 2 [3, 7] here, none in the golden"),
])
def test_a_check_giving_other_quality_inputs_than_were_frozen_fails_as_stale(
        pytester: pytest.Pytester, frozen: object, given: object, shown: str) -> None:
    run(pytester, frozen, "--ditgate-freeze").assert_outcomes(passed=1)
    before = (pytester.path / "golden" / "manifest.json").read_bytes()
    result = run(pytester, given)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*[[]golden_stale[]] golden 'case' for cpu was frozen for other inputs than this "
                                 f"test gives ({shown.replace('[', '[[]')}): it is not this test's baseline, and a "
                                 "judge would judge by the frozen ones; refreeze it*"])
    assert (pytester.path / "golden" / "manifest.json").read_bytes() == before  # a check writes nothing
    run(pytester, given, "--ditgate-refreeze").assert_outcomes(passed=1)
    run(pytester, given).assert_outcomes(passed=1)


def test_only_the_tensors_judged_count() -> None:
    """A candidate without an optional diagnostic is not stale for the diagnostic's kind."""
    frozen = {"kinds": {"latents": "latent", "step0.latents": "latent"}}
    assert disagreement({"kinds": {"latents": "latent"}}, frozen, ["latents", "images"]) is None
    assert for_tensors(frozen, ["images"]) == {"kinds": None, "labels": None}


@pytest.mark.parametrize("provenance", [{}, {"quality": "latent"}, {"quality": None}])
def test_a_missing_or_malformed_record_reads_as_none(provenance: dict) -> None:
    assert frozen_record(provenance) == {}


def test_the_record_keeps_plain_data() -> None:
    import torch

    record = quality_record({"kinds": {"x": "latent"}, "labels": torch.tensor([1, 2]), "models": object()})
    assert record == {"kinds": {"x": "latent"}, "labels": [1, 2]}
    assert json.loads(json.dumps(record)) == record
