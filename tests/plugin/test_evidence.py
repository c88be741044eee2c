"""The judge's reading of a child's evidence, unit by unit (no child process)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_ditgate.bench.stats import ratio_interval
from pytest_ditgate.experiment.evidence import REFERENCE_DRIFT, ChildEvidence, _device_label, judge_outputs, judge_timings
from pytest_ditgate.quality.contract import packaged_contract_path
from pytest_ditgate.verdict.outcome import Category


@pytest.mark.parametrize("key", ["sm_80.0badbeef", "cpu.zz", "gpu"])
def test_an_output_under_another_device_or_no_key_is_an_integrity_problem(tmp_path: Path, key: str) -> None:
    evidence = ChildEvidence(tmp_path / "out", outputs=[{"name": "case", "key": key, "file": "case.safetensors"}])
    problems: list[tuple[Category, str]] = []
    assert judge_outputs(tmp_path, evidence, [], "exact", packaged_contract_path(), "sm_90", problems) == []
    assert problems == [(Category.INTEGRITY,
                         f"output case@{key}: device key {key!r} is neither cpu nor this device")]


def test_a_machine_key_output_stands_for_its_device_key() -> None:
    assert _device_label("case@cpu.0f9e8d7c") == _device_label("case@cpu") == "case@cpu"
    assert _device_label("a@b@sm_90.1a2b3c4d") == "a@b@sm_90"
    assert _device_label("case@cpu.zz") == "case@cpu.zz"  # no key: stands only for itself


def _frozen_case(root: Path, baseline: dict, quality: dict | None = None) -> None:
    """A golden ``case`` under ``root/golden`` (key ``cpu``), written as a freeze run writes it, with the
    quality inputs ``quality`` its test gives."""
    from pytest_ditgate.golden.session import GoldenSession
    from pytest_ditgate.golden.store import GoldenStore

    session = GoldenSession(GoldenStore(root / "golden"), mode="freeze")
    session.check("case", baseline, "cpu", nodeid="t", quality_inputs=quality)
    session.finish()


def _output(root: Path, tensors: dict, **forged: object) -> ChildEvidence:
    """The child's evidence of one output ``case``; ``forged``: more fields of its record, as a candidate's
    process could write them."""
    from safetensors.torch import save_file

    out = root / "out"
    out.mkdir()
    save_file(tensors, str(out / "case.safetensors"))
    return ChildEvidence(out, outputs=[{"name": "case", "key": "cpu", "file": "case.safetensors", **forged}])


def test_frozen_kinds_reach_the_judge_and_unjudgeable_images_are_the_candidates_fault(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    contract = tmp_path / "contract.toml"
    contract.write_text("[metrics.rel_l2.numerical]\nmax = 1e-3\n")
    latents = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0)) * 3  # pixel space: not [0, 1]
    _frozen_case(tmp_path, {"latents": latents}, {"kinds": {"latents": "latent"}})
    problems: list[tuple[Category, str]] = []
    evidence = _output(tmp_path, {"latents": latents.clone()})
    (record,) = judge_outputs(tmp_path, evidence, ["case@cpu"], "numerical", contract, "sm_90", problems)
    assert problems == [] and record["passed"] and "latents.rel_l2" in record["metrics"]
    # frozen without the kind, the tensor reads as an image out of range: a verdict, never a judge crash
    bare = tmp_path / "bare"
    bare.mkdir()
    _frozen_case(bare, {"latents": latents})
    problems = []
    assert judge_outputs(bare, _output(bare, {"latents": latents.clone()}), [], "numerical", contract, "sm_90",
                         problems) == []
    assert len(problems) == 1 and problems[0][0] is Category.CRASH  # the baseline cannot be read: a setup fault
    assert "output case@cpu: cannot be judged: image tensor 'baseline:latents'" in problems[0][1]
    # a candidate whose images leave the declared range fails its golden: quality, named
    images = tmp_path / "images"
    images.mkdir()
    _frozen_case(images, {"images": torch.rand(2, 3, 8, 8)})
    contract.write_text("[metrics.psnr.numerical]\nmin = 30.0\n")
    problems = []
    judge_outputs(images, _output(images, {"images": torch.full((2, 3, 8, 8), 5.0)}), [], "numerical", contract,
                  "sm_90", problems)
    assert len(problems) == 1 and problems[0][0] is Category.QUALITY and "'candidate:images'" in problems[0][1]


NAME = "tests/test_speed.py::test_fwd::candidate / baseline"


def _comparison(mechanism: str, reference_ms: float) -> dict:
    """A comparison record as the child writes it: the candidate at 1 ms, the baseline at ``reference_ms``."""
    a, b = [1.0 + i * 1e-3 for i in range(9)], [reference_ms * (1 + i * 1e-3) for i in range(9)]
    ratio = ratio_interval(a, b).ratio
    return {"kind": "comparison", "test": "tests/test_speed.py::test_fwd", "comparison": {
        "a": {"label": "candidate", "samples_ms": a, "mechanism": mechanism, "arch": "sm_90"},
        "b": {"label": "baseline", "samples_ms": b}, "method": "bootstrap", "confidence": 0.95, "ratio": ratio}}


def _judged(mechanism: str, reference_ms: float, baseline_ms: float) -> list[tuple[Category, str]]:
    evidence = ChildEvidence(Path("out"), comparisons=[_comparison(mechanism, reference_ms)])
    problems: list[tuple[Category, str]] = []
    derived = judge_timings(evidence, [NAME], {NAME: baseline_ms}, problems)
    assert [d["name"] for d in derived] == [NAME]
    return problems


@pytest.mark.parametrize("mechanism", ["events", "cupti"])
def test_a_device_timed_reference_slowed_beyond_the_drift_limit_supports_no_speed_claim(mechanism: str) -> None:
    """A slowed reference is a performance DISCARD, not an integrity one: an honest empty commit on a loaded
    H200 host read its launch-bound XL reference 2.74x slower than at the baseline."""
    problems = _judged(mechanism, reference_ms=2.0 * REFERENCE_DRIFT * 1.1, baseline_ms=2.0)
    assert len(problems) == 1 and problems[0][0] is Category.PERFORMANCE
    median = 2.0 * REFERENCE_DRIFT * 1.1 * 1.004  # the fifth of nine samples
    assert problems[0][1].startswith(f"{NAME}: the reference took {median:.4g} ms, {median / 2.0:.2f}x its "
                                     "baseline 2 ms: a measurement this far off supports no speed claim")


@pytest.mark.parametrize("mechanism", ["events", "cupti"])
def test_a_device_timed_reference_within_the_drift_limit_passes(mechanism: str) -> None:
    assert _judged(mechanism, reference_ms=2.0 * REFERENCE_DRIFT * 0.9, baseline_ms=2.0) == []


def test_the_drift_check_leaves_host_clocks_alone() -> None:
    """A host's wall clock under load varies by more than the limit on its own."""
    assert _judged("wall", reference_ms=2.0 * REFERENCE_DRIFT * 1.5, baseline_ms=2.0) == []


def test_timing_samples_must_be_numbers_not_json_booleans() -> None:
    """JSON's true is an int to Python: a forged record of true samples must not read as 1 ms timings."""
    from pytest_ditgate.experiment.evidence import rederive

    record = _comparison("events", 2.0)
    record["comparison"]["a"]["samples_ms"] = [True] * 9
    derived, problem = rederive(record)
    assert derived is None and "not positive finite numbers" in problem
    assert rederive(_comparison("events", 2.0))[0] is not None


def test_the_judge_reads_the_projects_weights_as_the_childs_quality_session_does(tmp_path: Path) -> None:
    """LPIPS and CLIP weights named in [tool.ditgate] count in the judge too: a judge that knew only the
    classifier failed honest runs whose contract requires LPIPS with 'missing weights'."""
    from pytest_ditgate.experiment.evidence import _project_models

    (tmp_path / "pyproject.toml").write_text('[tool.ditgate]\nlpips_weights = "weights/lpips.pth"\n'
                                             'clip_weights = "/abs/clip.bin"\nclip_model = "ViT-L-14"\n'
                                             'classifier = "pkg.scorer:make"\n')
    config = _project_models(tmp_path).config
    assert config.lpips == str(tmp_path / "weights" / "lpips.pth")
    assert config.clip == "/abs/clip.bin" and config.clip_model == "ViT-L-14"
    assert config.classifier == "pkg.scorer:make" and config.root == str(tmp_path)


@pytest.mark.parametrize("project", ["none", "default_file", "named"])
def test_the_judge_reads_the_contract_the_childs_quality_session_reads(pytester: pytest.Pytester, project: str) -> None:
    """A project without a contract file is judged by the packaged default in the child; the judge compared
    its outputs with a plain tensor comparator instead, so the two could disagree on the same tensors."""
    from pytest_ditgate.experiment.preflight import quality_contract
    from pytest_ditgate.quality.contract import packaged_contract_path
    from pytest_ditgate.quality.quality_plugin import QualitySession

    root = pytester.path
    if project == "default_file":
        (root / "fixtures").mkdir()
        (root / "fixtures" / "quality_contract.toml").write_text("# the project's own\n")
    if project == "named":
        pytester.makepyprojecttoml('[tool.ditgate]\nquality_contract = "contracts/strict.toml"\n')
    config = pytester.parseconfigure(root)
    childs = QualitySession.from_config(config).contract_path
    table = {"quality_contract": "contracts/strict.toml"} if project == "named" else {}
    assert quality_contract(root, table) == childs
    expected = {"none": packaged_contract_path(), "default_file": root / "fixtures" / "quality_contract.toml",
                "named": root / "contracts" / "strict.toml"}[project]
    assert childs == expected


@pytest.mark.parametrize("forged", [{"kinds": {"images": "latent"}}, {"kinds": {"images": "latent"}, "labels": [1, 2]}])
def test_kinds_forged_in_the_childs_record_do_not_turn_the_judges_image_rules_off(tmp_path: Path,
                                                                                   forged: dict) -> None:
    """The child writes ``outputs.jsonl`` from the candidate's own process. Naming the image tensor a latent
    there dropped every image rule in the judge, and wrong images passed. The judge takes kinds and labels
    from what the baseline froze, never from the candidate."""
    torch = pytest.importorskip("torch")
    contract = tmp_path / "contract.toml"
    contract.write_text("[metrics.psnr.numerical]\nmin = 30.0\n[metrics.rel_l2.numerical]\nmax = 10.0\n")
    _frozen_case(tmp_path, {"images": torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))})
    problems: list[tuple[Category, str]] = []
    evidence = _output(tmp_path, {"images": torch.zeros(2, 3, 8, 8)}, quality=forged, kinds=forged["kinds"])
    (record,) = judge_outputs(tmp_path, evidence, ["case@cpu"], "numerical", contract, "sm_90", problems)
    assert not record["passed"] and "images.psnr" in record["metrics"]
    assert [category for category, _ in problems] == [Category.QUALITY] and "psnr" in problems[0][1], problems


def test_a_contract_outside_the_project_is_hashed_and_a_rewrite_during_the_run_is_integrity(tmp_path: Path) -> None:
    """A contract named by an absolute path lies outside the tree the lock and the golden folder cover: the
    judge hashes it too, so a candidate that rewrites it while its process runs is caught like any fixed file."""
    from pytest_ditgate.experiment.preflight import Preflight
    from pytest_ditgate.golden.fixed_paths import LockSettings

    root, outside = tmp_path / "project", tmp_path / "contracts" / "strict.toml"
    (root / "golden").mkdir(parents=True)
    outside.parent.mkdir()
    outside.write_text("[metrics.psnr.numerical]\nmin = 40.0\n")
    lock = LockSettings(root, ("golden/",), root / "golden" / "fixed_paths.lock.json")
    preflight = Preflight(root, lock, {"quality_contract": str(outside)}, root / ".ditgate", env={}, mutable=[])
    before = preflight.judged_files()
    assert str(outside.resolve()) in before
    problems: list[tuple[Category, str]] = []
    preflight.check_judged_files_kept(before, problems)
    assert problems == []
    outside.write_text("[metrics.psnr.numerical]\nmin = 0.0\n")  # the candidate loosens the contract
    preflight.check_judged_files_kept(before, problems)
    assert problems == [(Category.INTEGRITY, f"{outside.resolve()}: rewritten while the candidate's process ran "
                                             "(a fixed file the judge reads)")]
