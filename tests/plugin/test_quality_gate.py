"""quality_gate: each experiment class accepts what it should and rejects what it must, with readable reasons."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch  # noqa: F401  imported here once: pytester's in-process runs must not re-import it
import torchmetrics  # noqa: F401

REPO_CONTRACT = Path(__file__).resolve().parents[2] / "fixtures" / "quality_contract.toml"

# smooth random 64x64 images in [0, 1] and 4-channel latents, deterministic
HELPERS = """
import torch

def images(n=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 3, 64, 64, generator=g)
    return torch.nn.functional.avg_pool2d(x, 5, 1, 2).clamp(0, 1)

def latents(seed=1):
    return torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(seed))
"""

PATCH_CONTRACT = """
[images]
tile = 8
[metrics.psnr.numerical]
min = 30.0
[metrics.worst_tile_mae.numerical]
max = 0.05
"""


@pytest.fixture
def suite(pytester: pytest.Pytester):
    pytester.makepyfile(helpers=HELPERS)

    def make(body: str, contract: str | None = None) -> None:
        if contract is None:
            pytester.mkdir("fixtures")
            shutil.copy(REPO_CONTRACT, pytester.path / "fixtures" / "quality_contract.toml")
        else:
            pytester.makefile(".toml", quality_contract=contract)
        pytester.makepyfile(test_quality="from helpers import images, latents\nimport torch\n" + body)

    return make


def test_patch_corruption_fails_the_tile_check_while_psnr_passes(suite, pytester: pytest.Pytester) -> None:
    suite("""
def test_patch(quality_gate):
    base = images()
    cand = base.clone()
    cand[0, :, 20:24, 20:24] = (cand[0, :, 20:24, 20:24] + 0.3).clamp(0, 1)   # a 4x4 px corrupted patch
    quality_gate.check("patch", {"image": cand}, {"image": base})
""", PATCH_CONTRACT)
    result = pytester.runpytest("--ditgate", "--ditgate-contract=quality_contract.toml")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    result.stdout.fnmatch_lines(["*[[]quality[]] quality case 'patch' (numerical, fp32*",
                                 "*FAIL image.worst_tile_mae = 0.0* violates max 0.05 (numerical, fp32)*metrics.worst_tile_mae.numerical*"])
    assert "FAIL image.psnr" not in out  # PSNR alone would have passed this candidate
    record = json.loads((pytester.path / ".ditgate" / "quality" / "transitions.json").read_text())["cases"][0]
    psnr, tile = record["metrics"]["image.psnr"], record["metrics"]["image.worst_tile_mae"]
    print(f"patch corruption: PSNR {psnr:.2f} dB (min 30: passes), worst tile MAE {tile:.4f} (max 0.05: fails)")
    assert psnr > 30.0 and tile > 0.05
    # the failure message links the side-by-side PNG of the corrupted image, and it exists
    match = re.search(r"image: (\S+image_img0\.png)", out)
    assert match, out
    png = Path(match.group(1))
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.parent == pytester.path / ".ditgate" / "quality" / "patch"
    assert not (png.parent / "image_img1.png").exists()  # the untouched image is not written


def test_exact_fails_on_one_ulp_unless_budgeted(suite, pytester: pytest.Pytester) -> None:
    suite("""
def test_one_ulp(quality_gate):
    base = latents()
    cand = base.clone()
    cand[0, 0, 0, 0] = torch.nextafter(cand[0, 0, 0, 0], torch.tensor(float("inf")))
    result = quality_gate.check("ulp", {"latent": cand}, {"latent": base})
    assert result.metrics["latent.max_ulp"] == 1.0

def test_bitwise(quality_gate):
    base = latents()
    quality_gate.check("same", {"latent": base.clone()}, {"latent": base})
""", "[metrics.max_ulp.exact]\nmax = 0\n")
    result = pytester.runpytest("--ditgate", "--ditgate-contract=quality_contract.toml", "--ditgate-class=exact")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(["*FAIL latent.max_ulp = 1 violates max 0 (exact, fp32)*"])
    pytester.makefile(".toml", quality_contract="[metrics.max_ulp.exact]\nmax = 1  # stated ulp budget\n")
    pytester.runpytest("--ditgate", "--ditgate-contract=quality_contract.toml", "--ditgate-class=exact").assert_outcomes(passed=2)


def test_bf16_rounding_passes_numerical_and_fails_exact(suite, pytester: pytest.Pytester) -> None:
    """The repository contract: a bf16 run (here: bf16 rounding of the fp32 outputs) is a numerical change."""
    suite("""
def test_bf16(quality_gate):
    base = {"image": images(), "latent": latents()}
    cand = {"image": base["image"].bfloat16(), "latent": base["latent"].bfloat16()}
    result = quality_gate.check("bf16", cand, base)
    assert result.dtype == "bf16"
    print("METRICS", result.metrics)
""")
    passed = pytester.runpytest("--ditgate", "-s")
    passed.assert_outcomes(passed=1)
    passed.stdout.fnmatch_lines(["*METRICS*image.psnr*latent.rel_l2*latent.cosine*"])
    failed = pytester.runpytest("--ditgate", "--ditgate-class=exact")
    failed.assert_outcomes(failed=1)
    failed.stdout.fnmatch_lines(["*FAIL image.max_ulp = inf violates max 0 (exact, bf16)*",
                                 "*FAIL latent.max_ulp = inf violates max 0 (exact, bf16)*"])


def test_numerical_rejects_a_real_difference_and_zeros(suite, pytester: pytest.Pytester) -> None:
    suite("""
import pytest
@pytest.mark.parametrize("how", ["noise", "zeros"])
def test_bad(quality_gate, how):
    base = latents()
    cand = base + 0.2 * latents(seed=7) if how == "noise" else torch.zeros_like(base)
    quality_gate.check(how, {"latent": cand}, {"latent": base}, compute_dtype=torch.bfloat16)
""")
    result = pytester.runpytest("--ditgate")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*FAIL latent.rel_l2 = 0.* violates max 0.06 (numerical, bf16)*fixtures/quality_contract.toml: metrics.rel_l2.numerical]",
                                 "*FAIL latent.rel_l2 = 1 violates max 0.06*", "*FAIL latent.cosine = 0 violates min 0.995*"])


def test_missing_candidate_tensor_nonfinite_and_shape_fail(suite, pytester: pytest.Pytester) -> None:
    suite("""
def test_missing(quality_gate):
    quality_gate.check("missing", {"other": latents()}, {"latent": latents()})

def test_nan(quality_gate):
    cand = latents()
    cand[0, 0, 0, :3] = float("nan")
    quality_gate.check("nan", {"latent": cand}, {"latent": latents()})

def test_shape(quality_gate):
    quality_gate.check("shape", {"latent": latents()[:1]}, {"latent": latents()})
""", "[metrics.rel_l2.numerical]\nmax = 0.01\n")
    result = pytester.runpytest("--ditgate", "--ditgate-contract=quality_contract.toml")
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines([
        "*FAIL latent: the candidate has no tensor 'latent' (the baseline has it, (2, 4, 8, 8) torch.float32)*",
        "*FAIL latent: tensor 'candidate:latent' is not finite: 3 NaN and 0 Inf values out of 512*",
        "*FAIL latent: candidate shape (1, 4, 8, 8) != baseline shape (2, 4, 8, 8)*",
    ])


def test_misuse_is_an_error_not_a_gate_failure(suite, pytester: pytest.Pytester) -> None:
    suite("""
import pytest
from pytest_ditgate.errors import DitgateUsageError

def test_range(quality_gate):
    base = images() * 2 - 1   # [-1, 1] images, but the contract declares [0, 1]
    with pytest.raises(DitgateUsageError, match=r"image tensor 'baseline:image' has values in \\[-0.7757, 0.4618\\], outside the declared range \\[0, 1\\]; if its images are in \\[-1, 1\\], declare that"):
        quality_gate.check("range", {"image": base}, {"image": base})
    quality_gate.check("range", {"image": base}, {"image": base}, image_range=(-1.0, 1.0))

def test_corrupt_golden(quality_gate):
    base = latents()
    base[0, 0, 0, 0] = float("inf")
    with pytest.raises(DitgateUsageError, match="'baseline:latent' is not finite: 0 NaN and 1 Inf.*corrupt golden"):
        quality_gate.check("golden", {"latent": latents()}, {"latent": base})

def test_kinds(quality_gate):
    with pytest.raises(DitgateUsageError, match="kinds\\\\['latent'\\\\] = 'picture'"):
        quality_gate.check("k", {"latent": latents()}, {"latent": latents()}, kinds={"latent": "picture"})
""", "[metrics.psnr.numerical]\nmin = 30.0\n[metrics.rel_l2.numerical]\nmax = 0.01\n")
    pytester.runpytest("--ditgate", "--ditgate-contract=quality_contract.toml").assert_outcomes(passed=3)


def test_tolerance_scale_loosens_pair_limits(suite, pytester: pytest.Pytester) -> None:
    suite("""
def test_scaled(quality_gate):
    base = latents()
    cand = base * 1.02   # rel_l2 = 0.02
    quality_gate.check("fallback", {"latent": cand}, {"latent": base}, tolerance_scale=4.0)
    import pytest
    from pytest_ditgate.errors import GateFailure
    with pytest.raises(GateFailure, match="rel_l2 = 0.02 violates max 0.01"):
        quality_gate.check("strict", {"latent": cand}, {"latent": base})
""", "[metrics.rel_l2.numerical]\nmax = 0.01\n")
    pytester.runpytest("--ditgate", "--ditgate-contract=quality_contract.toml").assert_outcomes(passed=1)


def test_gate_is_skipped_when_gates_are_off(suite, pytester: pytest.Pytester) -> None:
    suite("def test_q(quality_gate):\n    raise AssertionError('must not run')\n")
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*gates are off; run pytest with --ditgate*"])


def test_transition_table_collects_xdist_workers_results(suite, pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    suite("""
import pytest
@pytest.mark.parametrize("scale", [1.001, 1.5])
def test_lat(quality_gate, scale):
    base = latents()
    quality_gate.check(f"x{scale}", {"latent": base * scale}, {"latent": base})
""", "[metrics.rel_l2.numerical]\nmax = 0.01\n")
    result = pytester.runpytest("--ditgate", "--ditgate-contract=quality_contract.toml", "-p", "xdist", "-n", "1")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["pass->pass *1  kept", "pass->fail *1  REJECTS the candidate",
                                 "  pass->fail test_quality.py::test_lat[[]1.5[]] [[]x1.5[]] numerical/fp32 FAILED: latent.rel_l2 = 0.5*"])
    summary = json.loads((pytester.path / ".ditgate" / "quality" / "transitions.json").read_text())
    assert summary["counts"]["pass->fail"] == 1 and len(summary["cases"]) == 2
