"""LPIPS and CLIP score: weights only from local paths (never a download), skip or fail when absent,
the real loading path on randomly initialised weights saved where the real ones would be, the
quantization class's zero regression, and the baseline -> candidate transition table."""

from __future__ import annotations

import functools
import json
import socket
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
lpips = pytest.importorskip("lpips")
open_clip = pytest.importorskip("open_clip")
import torchmetrics  # noqa: E402,F401  imported once here: pytester's in-process runs must not re-import

from pytest_ditgate.quality import contract_from_dict, evaluate_quality  # noqa: E402
from pytest_ditgate.quality.perceptual import ALEXNET_FILE, PerceptualModels, WeightsConfig  # noqa: E402

PROMPT = "a photo of a red square"
TINY_CLIP = {"model_cfg": {"embed_dim": 32,
                           "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 16},
                           "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1}},
             "preprocess_cfg": {}}


def _images(seed: int, n: int = 2) -> "torch.Tensor":
    x = torch.rand(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
    return torch.nn.functional.avg_pool2d(x, 3, 1, 1)


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Random weights saved in the real formats and places: torchvision's AlexNet checkpoint under
    TORCH_HOME/hub/checkpoints, LPIPS linear layers, and a tiny open_clip model in open_clip's local-dir format."""
    import torchvision
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("weights")
    torch.manual_seed(0)
    features = torchvision.models.alexnet(weights=None).features  # the backbone LPIPS uses
    hub = root / "torch_home" / "hub" / "checkpoints"
    hub.mkdir(parents=True)
    torch.save({f"features.{k}": v for k, v in features.state_dict().items()}, hub / ALEXNET_FILE)
    lp = root / "lpips"
    lp.mkdir()
    (lp / ALEXNET_FILE).write_bytes((hub / ALEXNET_FILE).read_bytes())
    with pytest.warns(UserWarning):  # torchvision's note about lpips' legacy ``pretrained`` argument
        net = lpips.LPIPS(pretrained=False, net="alex", pnet_rand=True, verbose=False)
    torch.save({k: v for k, v in net.state_dict().items() if k.startswith("lin")}, lp / "alex.pth")
    clip = root / "clip"
    clip.mkdir()
    (clip / "open_clip_config.json").write_text(json.dumps(TINY_CLIP))
    torch.manual_seed(0)  # a seed whose random CLIP gives positive scores (CLIP score clamps at 0)
    model = open_clip.create_model(f"local-dir:{clip}", load_weights=False, pretrained_text=False)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(clip / "open_clip_model.safetensors"))
    return {"torch_home": root / "torch_home", "lpips": lp, "clip": clip, "empty": root / "empty",
            "hub_file": hub / ALEXNET_FILE}


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch, weights: dict[str, Path]) -> None:
    """No network, and torchvision's cache pointed at an empty folder unless a test says otherwise."""
    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setenv("TORCH_HOME", str(weights["empty"]))


def test_lpips_loads_the_backbone_from_where_torchvision_looks(monkeypatch: pytest.MonkeyPatch, weights) -> None:
    monkeypatch.setenv("TORCH_HOME", str(weights["torch_home"]))
    models = PerceptualModels(WeightsConfig())
    net = models.lpips()
    saved = torch.load(weights["hub_file"], weights_only=True)
    assert torch.equal(net.net.slice1[0].weight, saved["features.0.weight"])
    assert torch.equal(getattr(net.net.slice5, "10").weight, saved["features.10.weight"])
    a, b = _images(1), _images(2)
    assert models.lpips_per_image(a, a).abs().max() < 1e-6
    assert (models.lpips_per_image(a, b) > 0).all()
    assert models.lpips() is net  # cached for the session


def test_configured_lpips_folder_and_clip_checkpoint_load(weights) -> None:
    models = PerceptualModels(WeightsConfig(lpips=str(weights["lpips"]), clip=str(weights["clip"])))
    linear = torch.load(weights["lpips"] / "alex.pth", weights_only=True)
    assert torch.equal(models.lpips().lin0.model[1].weight, linear["lin0.model.1.weight"])
    scorer = models.clip()
    saved = __import__("safetensors.torch", fromlist=["load_file"]).load_file(str(weights["clip"] / "open_clip_model.safetensors"))
    assert torch.equal(scorer.model.visual.conv1.weight, saved["visual.conv1.weight"])
    scores = scorer.score(_images(3), [PROMPT, PROMPT])
    assert scores.shape == (2,) and torch.isfinite(scores).all()


def test_clip_checkpoint_file_with_model_name_and_bad_files(tmp_path: Path, weights) -> None:
    from pytest_ditgate.quality.perceptual import BadWeights, MissingWeights, build_clip

    with pytest.raises(MissingWeights, match=r"CLIP checkpoint .*nope.pt \(--ditgate-clip-weights\) does not exist"):
        build_clip(WeightsConfig(clip=str(tmp_path / "nope.pt")))
    other = tmp_path / "other_clip"  # another architecture's config next to this checkpoint
    other.mkdir()
    config = json.loads(json.dumps(TINY_CLIP))
    config["model_cfg"]["embed_dim"] = 16
    (other / "open_clip_config.json").write_text(json.dumps(config))
    (other / "open_clip_model.safetensors").write_bytes((weights["clip"] / "open_clip_model.safetensors").read_bytes())
    with pytest.raises(BadWeights, match=r"open_clip_model.safetensors does not fit model local-dir:.*other_clip"):
        build_clip(WeightsConfig(clip=str(other)))
    with pytest.raises(MissingWeights, match=r"CLIP weights folder .* has no open_clip_config.json"):
        build_clip(WeightsConfig(clip=str(tmp_path)))
    truncated = tmp_path / "lp"
    truncated.mkdir()
    (truncated / ALEXNET_FILE).write_bytes(weights["hub_file"].read_bytes()[:1000])
    with pytest.raises(BadWeights, match=rf"cannot read weights file .*{ALEXNET_FILE}"):
        PerceptualModels(WeightsConfig(lpips=str(truncated))).lpips()


CONTRACT_OPTIONAL = """
[metrics.psnr.approximate]
min = 10.0
[metrics.lpips.approximate]
required = false
max = 0.5
[metrics.clip_score.approximate]
required = false
abs = 100.0
"""

SUITE = f"""
import torch
PROMPT = {PROMPT!r}
def images(seed):
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
    return torch.nn.functional.avg_pool2d(x, 3, 1, 1)
"""


def test_missing_weights_skip_with_how_to_or_fail_when_required(pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", quality_contract=CONTRACT_OPTIONAL)
    pytester.makepyfile(SUITE + """
def test_optional(quality_gate):
    base = images(1)
    result = quality_gate.check("opt", {"image": base + 0.001}, {"image": base}, prompts=PROMPT)
    print("SKIPPED", sorted(result.skipped))
""")
    args = ("--ditgate", "--ditgate-contract=quality_contract.toml", "--ditgate-class=approximate", "-s")
    result = pytester.runpytest(*args)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "*SKIPPED [[]'image.clip_score', 'image.lpips'[]]*",
        "skipped clip_score in 1 case(s): CLIP weights are not configured; provide a local CLIP checkpoint: point "
        "--ditgate-clip-weights (ini ditgate_clip_weights) at an open_clip checkpoint file*no download is attempted",
        f"skipped lpips in 1 case(s): LPIPS weights not found (looked for *{ALEXNET_FILE}); provide local LPIPS weights: "
        f"put torchvision's {ALEXNET_FILE} where torchvision looks*TORCH_HOME*--ditgate-lpips-weights*no download is attempted",
    ])
    pytester.makefile(".toml", quality_contract=CONTRACT_OPTIONAL.replace("required = false", "required = true"))
    failed = pytester.runpytest(*args)
    failed.assert_outcomes(failed=1)
    failed.stdout.fnmatch_lines([
        "*FAIL image.lpips: required by quality_contract.toml: metrics.lpips.approximate but not computed: LPIPS weights not found*",
        "*FAIL image.clip_score: required by quality_contract.toml: metrics.clip_score.approximate but not computed: "
        "CLIP weights are not configured*",
    ])


def test_real_weights_through_the_options(pytester: pytest.Pytester, weights) -> None:
    pytester.makefile(".toml", quality_contract=CONTRACT_OPTIONAL.replace("required = false", "required = true"))
    pytester.makepyfile(SUITE + """
def test_with_weights(quality_gate):
    base = images(1)
    result = quality_gate.check("w", {"image": (base + 0.01).clamp(0, 1)}, {"image": base}, prompts=PROMPT)
    assert not result.skipped, result.skipped
    print("VALUES", result.metrics["image.lpips"], result.metrics["image.clip_score"], result.baseline_metrics)
""")
    result = pytester.runpytest("--ditgate", "--ditgate-contract=quality_contract.toml", "--ditgate-class=approximate",
                                f"--ditgate-lpips-weights={weights['lpips']}", f"--ditgate-clip-weights={weights['clip']}", "-s")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*VALUES * * {'image.clip_score': *}*"])


@functools.lru_cache(maxsize=None)
def _scorer(path: str):
    return PerceptualModels(WeightsConfig(clip=path)).clip()


def _scores(weights, *seeds: int) -> list[float]:
    scorer = _scorer(str(weights["clip"]))
    return [float(scorer.score(_images(seed), [PROMPT]).mean()) for seed in seeds]


def test_quantization_rejects_any_clip_score_regression(weights) -> None:
    high, low = sorted(range(1, 6), key=lambda s: _scores(weights, s)[0], reverse=True)[:2]
    assert _scores(weights, low)[0] < _scores(weights, high)[0]
    contract = contract_from_dict({"metrics": {
        "psnr": {"quantization": {"min": 0.0}, "approximate": {"min": 0.0}},
        "clip_score": {"quantization": {}, "approximate": {"abs": 100.0}}}}, source="q.toml")
    models = PerceptualModels(WeightsConfig(clip=str(weights["clip"])))

    def judge(cand_seed: int, base_seed: int, cls: str):
        return evaluate_quality({"image": _images(cand_seed)}, {"image": _images(base_seed)}, contract=contract,
                                experiment_class=cls, case="q", prompts=PROMPT, models=models)

    worse = judge(low, high, "quantization")
    assert not worse.passed
    assert worse.metrics["image.clip_score"] < worse.baseline_metrics["image.clip_score"]
    assert any("image.clip_score" in f and "no regression (quantization" in f for f in worse.failures), worse.failures
    assert judge(low, high, "approximate").passed  # the same change is within approximate's budget
    assert judge(high, high, "quantization").passed  # equal is not a regression
    assert judge(high, low, "quantization").passed  # better is fine


def test_transition_table_in_terminal_and_json(pytester: pytest.Pytester, weights) -> None:
    order = sorted(range(1, 6), key=lambda s: _scores(weights, s)[0], reverse=True)
    high, low = order[0], order[-1]
    hi_score, lo_score = _scores(weights, high, low)
    floor = (hi_score + lo_score) / 2
    pytester.makefile(".toml", quality_contract=f"""
[metrics.psnr.approximate]
min = 0.0
[metrics.clip_score]
min = {floor}
[metrics.clip_score.approximate]
""")
    pytester.makepyfile(SUITE + f"""
import pytest
HIGH, LOW = images({high}), images({low})
@pytest.mark.parametrize("case, cand, base", [
    ("keep", HIGH, HIGH), ("regress", LOW, HIGH), ("improve", HIGH, LOW), ("both_low", LOW, LOW)])
def test_case(quality_gate, case, cand, base):
    result = quality_gate.check(case, {{"image": cand}}, {{"image": base}}, prompts=PROMPT)
    print("TRANSITION", case, result.transition)
""")
    result = pytester.runpytest("--ditgate", "--ditgate-contract=quality_contract.toml", "--ditgate-class=approximate",
                                f"--ditgate-clip-weights={weights['clip']}")
    result.assert_outcomes(passed=3, failed=1)  # only the case that passed at baseline and fails now rejects
    result.stdout.fnmatch_lines([
        "*ditgate quality: baseline -> candidate*",
        "pass->pass *1  kept",
        "pass->fail *1  REJECTS the candidate",
        "fail->pass *1  fixed",
        "fail->fail *1  failed at baseline too",
        "  pass->fail test_*regress* [[]regress[]] approximate/fp32 FAILED: image.clip_score = * (baseline *) violates min *",
    ])
    result.stdout.fnmatch_lines(["  fail->fail *both_low* passed: image.clip_score = *the baseline misses it too*"])
    summary = json.loads((pytester.path / ".ditgate" / "quality" / "transitions.json").read_text())
    assert summary["counts"] == {"pass->pass": 1, "pass->fail": 1, "fail->pass": 1, "fail->fail": 1}
    assert summary["rejected"] is True
    by_case = {c["case"]: c for c in summary["cases"]}
    assert by_case["regress"]["baseline_metrics"]["image.clip_score"] == pytest.approx(hi_score, rel=1e-4)
