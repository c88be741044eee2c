"""The contract's ``[structural]`` table: under a class it names, a case is judged on its tensors' shapes,
finiteness and image range only (no metric means anything there: a random-weight model's sample under another
sampler), and the result says so; every other case of the class is judged by its metrics."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pytest_ditgate.quality.contract import ContractError, contract_from_dict  # noqa: E402
from pytest_ditgate.quality.evaluate import evaluate_quality  # noqa: E402
from pytest_ditgate.quality.report import table_lines  # noqa: E402

CONTRACT = {"structural": {"approximate": ["!shapes-*"]},
            "metrics": {"rel_l2": {"kinds": ["latent"], "numerical": {"max": 1e-3}, "approximate": {"max": 1e-3}},
                        "psnr": {"approximate": {"min": 30.0}}}}


def outputs(seed: int, *, scale: float = 1.0) -> dict[str, "torch.Tensor"]:
    g = torch.Generator().manual_seed(seed)
    return {"latents": torch.randn(2, 4, 8, 8, generator=g) * scale, "images": torch.rand(2, 3, 16, 16, generator=g)}


def judge(candidate, case: str = "tiny-ddim-8", cls: str = "approximate"):
    return evaluate_quality(candidate, outputs(0), contract=contract_from_dict(CONTRACT, source="c.toml"),
                            experiment_class=cls, case=case)


def test_a_structural_case_is_judged_on_shapes_and_finiteness_and_says_so() -> None:
    result = judge(outputs(1))  # other noise altogether: no metric would mean anything
    assert result.passed and result.metrics == {} and result.failures == []
    assert result.structural == ("judged on shapes and finiteness only: c.toml [structural] says the outputs of case "
                                 "'tiny-ddim-8' carry no meaning under class 'approximate' (no metric judges them)")
    assert result.structural in result.summary() and result.to_dict()["structural"] == result.structural
    record = {**result.to_dict(), "nodeid": "t::q"}
    assert any(line.startswith("tiny-ddim-8: judged on shapes and finiteness only") for line in table_lines([record]))


@pytest.mark.parametrize("broken, words", [
    ({"latents": torch.full((2, 4, 8, 8), float("nan"))}, "latents: tensor 'candidate:latents' is not finite"),
    ({"latents": torch.zeros(2, 4, 4, 4)}, "candidate shape (2, 4, 4, 4) != baseline shape (2, 4, 8, 8)"),
    ({"images": torch.full((2, 3, 16, 16), 3.0)}, "images:"),
    ({"images": None}, "the candidate has no tensor 'images'"),
])
def test_a_structural_case_still_fails_broken_outputs(broken, words) -> None:
    candidate = {**outputs(1), **broken}
    candidate = {k: v for k, v in candidate.items() if v is not None}
    result = judge(candidate)
    assert not result.passed and any(words in text for text in result.failures), result.failures


def test_other_cases_and_other_classes_keep_their_metrics() -> None:
    shapes = judge(outputs(1), case="shapes-ddim-20")
    assert shapes.structural is None and not shapes.passed and "latents.rel_l2" in shapes.metrics
    numerical = judge(outputs(1), cls="numerical")
    assert numerical.structural is None and not numerical.passed


def test_the_table_names_classes_and_takes_case_patterns() -> None:
    with pytest.raises(ContractError, match="unknown key structural.'approx'.*keys are experiment classes"):
        contract_from_dict({**CONTRACT, "structural": {"approx": ["tiny-*"]}}, source="c.toml")
    with pytest.raises(ContractError, match="structural.approximate must be a list of case-name patterns"):
        contract_from_dict({**CONTRACT, "structural": {"approximate": "tiny-*"}}, source="c.toml")
    contract = contract_from_dict(CONTRACT, source="c.toml")
    assert contract.to_dict()["structural"] == {"approximate": ["!shapes-*"]}
    assert contract.structure_only("quantization", "tiny-ddim-8") is None


def test_the_repository_contract_judges_random_weights_structurally_under_approximate_only() -> None:
    from pathlib import Path

    from pytest_ditgate.quality.contract import load_contract

    contract = load_contract(Path(__file__).resolve().parents[2] / "fixtures" / "quality_contract.toml")
    for case in ("tiny-ddim-8", "tiny-euler-6-nocfg", "xl-ddim-10"):
        assert contract.structure_only("approximate", case)
        assert all(contract.structure_only(cls, case) is None for cls in ("exact", "numerical", "quantization"))
    assert contract.structure_only("approximate", "shapes-ddim-50") is None
    learned = {r.metric for r in contract.rules("approximate") if r.applies_to("shapes-ddim-20") and r.required}
    assert learned == {"class_accuracy", "frechet_distance"}
