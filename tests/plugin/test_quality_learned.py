"""Learned metrics from the project's own classifier: class accuracy and a Frechet distance, judged offline.

A toy classifier (its "class" is the brightest channel; features are channel means and spreads) stands
in for a trained one, so every rule can be checked exactly: zero regression within the seed noise for
quantization, a floor judged on the baseline too, the case patterns, and the usage errors.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pytest_ditgate.errors import DitgateUsageError  # noqa: E402
from pytest_ditgate.quality import PerceptualModels, WeightsConfig, contract_from_dict, evaluate_quality  # noqa: E402
from pytest_ditgate.quality import learned  # noqa: E402

FACTORY = "toy_classifier:build"
TOY = '''
import torch

class Toy:
    def logits(self, images):
        return images.float().mean(dim=(2, 3))

    def features(self, images):
        x = images.float()
        return torch.cat([x.mean(dim=(2, 3)), x.std(dim=(2, 3))], dim=1)

    def reference_statistics(self):
        return torch.full((6,), 0.5, dtype=torch.float64), torch.eye(6, dtype=torch.float64) * 0.01

def build(device):
    return Toy()
'''


def coloured(labels: list[int], seed: int, strength: float = 0.6) -> "torch.Tensor":
    """Noisy images whose channel ``label`` is brighter by ``strength``."""
    g = torch.Generator().manual_seed(seed)
    images = 0.2 + 0.2 * torch.rand(len(labels), 3, 8, 8, generator=g)
    for index, label in enumerate(labels):
        images[index, label] += strength
    return images.clamp(0, 1)


@pytest.fixture
def toy(tmp_path, monkeypatch) -> PerceptualModels:
    (tmp_path / "toy_classifier.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    return PerceptualModels(WeightsConfig(classifier=FACTORY))


CONTRACT = {"metrics": {
    "class_accuracy": {"cases": ["shapes-*"], "min": 0.5, "noise": 0.1,
                       "numerical": {"abs": 0.1}, "quantization": {}},
    "frechet_distance": {"cases": ["shapes-*"], "noise": 0.05, "numerical": {"abs": 0.05}, "quantization": {}},
    "rel_l2": {"numerical": {"max": 10.0}, "quantization": {"max": 10.0}}}}
LABELS = [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]


def judge(models, candidate, baseline, cls: str, case: str = "shapes-a", labels=LABELS):
    return evaluate_quality({"images": candidate}, {"images": baseline}, contract=contract_from_dict(CONTRACT),
                            experiment_class=cls, case=case, labels=labels, models=models)


def test_identical_outputs_pass_quantization_judged_by_the_learned_metrics(toy) -> None:
    images = coloured(LABELS, 0)
    result = judge(toy, images, images, "quantization")
    assert result.passed, result.summary()
    assert result.perceptual == ["class_accuracy", "frechet_distance"]
    assert result.metrics["images.class_accuracy"] == result.baseline_metrics["images.class_accuracy"] == 1.0


def test_quantization_allows_no_regression_beyond_the_seed_noise(toy) -> None:
    base = coloured(LABELS, 0)
    one_wrong = base.clone()
    one_wrong[0] = coloured([1], 0)[0]  # 1 of 10 images now reads as another class: -0.1, the noise
    assert judge(toy, one_wrong, base, "quantization").passed
    two_wrong = one_wrong.clone()
    two_wrong[1] = coloured([2], 1)[0]
    result = judge(toy, two_wrong, base, "quantization")
    assert not result.passed
    assert any(f.startswith("images.class_accuracy = 0.8 (baseline 1)") and "beyond seed noise 0.1" in f
               for f in result.failures), result.failures


def test_a_frechet_regression_fails_and_an_improvement_passes(toy) -> None:
    base = coloured(LABELS, 0)
    washed = base * 0.5  # right classes, a distribution further from the reference (FD 0.76 -> 0.91)
    worse = judge(toy, washed, base, "numerical")
    assert worse.metrics["images.class_accuracy"] == 1.0
    assert not worse.passed and any(f.startswith("images.frechet_distance") for f in worse.failures)
    assert judge(toy, base, washed, "numerical").passed


def test_floor_is_judged_on_the_baseline_too(toy) -> None:
    weak = coloured([1] * 10, 0)  # every image reads as class 1: accuracy 0.3 < floor 0.5
    result = judge(toy, weak, weak, "numerical")
    assert result.passed and result.transition == "fail->fail"
    assert judge(toy, coloured(LABELS, 0), weak, "numerical").transition == "fail->pass"


def test_case_patterns_decide_which_cases_are_judged_perceptually(toy) -> None:
    images = coloured(LABELS, 0)
    result = judge(toy, images, images, "numerical", case="tiny-ddim-8", labels=None)
    assert result.passed and result.perceptual == [] and "images.class_accuracy" not in result.metrics


def test_missing_labels_or_classifier_fail_a_required_metric_with_the_reason(toy) -> None:
    images = coloured(LABELS, 0)
    result = judge(toy, images, images, "numerical", labels=None)
    assert not result.passed
    assert any("class_accuracy needs the class label of every image: pass labels=[...]" in f for f in result.failures)
    bare = judge(PerceptualModels(WeightsConfig()), images, images, "numerical")
    assert any("no classifier is configured; name a classifier factory 'package.module:callable'" in f
               for f in bare.failures), bare.failures
    neither = judge(PerceptualModels(WeightsConfig()), images, images, "numerical", labels=None)
    assert any("class_accuracy needs the class label" in f for f in neither.failures), neither.failures  # said first


@pytest.mark.parametrize("spec, message", [
    ("toy_classifier", "must be written 'package.module:callable'"),
    ("no_such_module_xyz:build", "cannot import 'no_such_module_xyz'"),
    ("toy_classifier:nothing", "'toy_classifier' has no 'nothing'"),
])
def test_bad_factory_specs_are_usage_errors(toy, spec, message) -> None:
    with pytest.raises(DitgateUsageError, match=message):
        learned.build_classifier(spec, "cpu")


def test_wrong_label_count_is_a_usage_error(toy) -> None:
    images = coloured(LABELS, 0)
    with pytest.raises(DitgateUsageError, match="3 labels for 10 images"):
        judge(toy, images, images, "numerical", labels=[0, 1, 2])


def test_gaussian_frechet_is_zero_for_the_reference_itself() -> None:
    g = torch.Generator().manual_seed(0)
    features = torch.randn(4000, 3, generator=g, dtype=torch.float64)
    mu, sigma = features.mean(dim=0), torch.cov(features.T)
    assert learned.gaussian_frechet(features, mu, sigma) == pytest.approx(0.0, abs=1e-9)
    shifted = learned.gaussian_frechet(features + 2.0, mu, sigma)
    assert shifted == pytest.approx(12.0, rel=1e-6)  # |2, 2, 2|^2


def test_the_gate_reads_the_factory_from_the_project(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(toy_classifier=TOY)
    pytester.makefile(".toml", pyproject='[tool.ditgate]\nclassifier = "toy_classifier:build"\n'
                      '[tool.pytest.ini_options]\npythonpath = ["."]\n')
    pytester.makefile(".toml", contract='''
[metrics.class_accuracy]
cases = ["shapes-*"]
noise = 0.0
[metrics.class_accuracy.quantization]
''')
    pytester.makepyfile('''
import torch

def test_same(quality_gate):
    images = torch.zeros(3, 3, 4, 4)
    for i in range(3):
        images[i, i] = 1.0
    result = quality_gate.check("shapes-x", images, images, labels=[0, 1, 2])
    assert result.perceptual == ["class_accuracy"]

def test_worse(quality_gate):
    base = torch.zeros(2, 3, 4, 4)
    base[0, 0] = base[1, 1] = 1.0
    quality_gate.check("shapes-y", base.flip(0), base, labels=[0, 1])
''')
    result = pytester.runpytest("--ditgate", "--ditgate-contract=contract.toml", "--ditgate-class=quantization",
                                "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*shapes-y.class_accuracy = 0 (baseline 1) violates no regression (quantization*"])


def test_candidate_images_out_of_range_fail_the_case_instead_of_stopping_the_run(toy) -> None:
    images = coloured(LABELS, 0)
    result = judge(toy, images * 3, images, "numerical")
    assert not result.passed
    assert any(f.startswith("images: image tensor 'candidate:images' has values in") for f in result.failures)


def test_a_case_no_rule_judges_is_a_usage_error_not_a_pass(toy) -> None:
    contract = contract_from_dict({"metrics": {"psnr": {"cases": ["!shapes-*"], "numerical": {"min": 30.0}}}})
    images = coloured(LABELS, 0)
    with pytest.raises(DitgateUsageError, match="no rule of class 'numerical' judges case 'shapes-a'"):
        evaluate_quality({"images": images}, {"images": images}, contract=contract, experiment_class="numerical",
                         case="shapes-a", models=toy)
