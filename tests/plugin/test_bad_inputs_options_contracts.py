"""Bad options, ini values, paths and quality contracts: exit 4 before any test runs, naming the source and
the allowed values; the shipped default contract; quality_gate.check with tensors."""

from __future__ import annotations

import pytest

NEVER = "def test_never_runs(): raise SystemExit('ran')"


def _usage_error(result: pytest.RunResult, message: str) -> None:
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    result.stderr.fnmatch_lines([message])
    assert "INTERNALERROR" not in result.stderr.str() and "Traceback" not in result.stderr.str()


@pytest.mark.parametrize(("args", "ini", "message"), [
    (["--ditgate-bench-budget-ms=nan"], "", "*--ditgate-bench-budget-ms: must be a finite number, got nan*"),
    (["--ditgate-bench-budget-ms=inf"], "", "*--ditgate-bench-budget-ms: must be a finite number, got inf*"),
    (["--ditgate-min-improvement=nan"], "", "*--ditgate-min-improvement: must be a number in [[]0, 0.5), got nan*"),
    ([], "ditgate_kernel_trials = abc", "ERROR: ini option ditgate_kernel_trials='abc': invalid literal for int()*"),
    ([], "ditgate_bench_budget_ms = -3", "ERROR: ini option ditgate_bench_budget_ms='-3': must be > 0, got -3.0"),
    ([], "ditgate_class = fast", "ERROR: ini option ditgate_class='fast': choose from exact, numerical, approximate, quantization"),
    ([], "ditgate_freeze = maybe", "ERROR: ini option ditgate_freeze: invalid truth value 'maybe'; use true or false"),
    (["--ditgate-dir=test_bad_ini.py"], "", "ERROR: --ditgate-dir=test_bad_ini.py: * is a file, not a folder*"),
    (["--ditgate-golden-dir=test_bad_ini.py"], "", "ERROR: --ditgate-golden-dir=test_bad_ini.py: * is a file, not a folder*"),
    (["--ditgate-lpips-weights=nowhere"], "", "ERROR: --ditgate-lpips-weights (or ini ditgate_lpips_weights*) = *nowhere: no such folder*"),
    (["--ditgate-clip-weights=nowhere.pt"], "", "ERROR: --ditgate-clip-weights (or ini ditgate_clip_weights*) = *nowhere.pt: no such file or folder*"),
    (["--ditgate-target=sm_8x"], "", "ERROR: --ditgate-target=sm_8x: unknown device profile 'sm_8x'*"),
])
def test_bad_option_or_ini_value(pytester: pytest.Pytester, args: list[str], ini: str, message: str) -> None:
    pytester.makepyfile(test_bad_ini=NEVER)
    pytester.makeini(f"[pytest]\n{ini}\n")
    _usage_error(pytester.runpytest("--ditgate", "-p", "no:cacheprovider", *args), message)


def test_ditgate_dir_from_the_environment_is_checked(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_env=NEVER)
    monkeypatch.setenv("DITGATE_DIR", "test_env.py")
    _usage_error(pytester.runpytest("--ditgate", "-p", "no:cacheprovider"), "ERROR: DITGATE_DIR=test_env.py: * is a file*")


@pytest.mark.parametrize(("contract", "args", "message"), [
    (b"[metrics.rel_l2.numerical]\nmax = inf\n", [],
     "ERROR: c.toml: metrics.rel_l2.numerical.max must be a finite number, got inf (an infinite bound checks nothing*"),
    (b"[metrics.psnr.numerical]\nmin = { bf16 = -inf }\n", [],
     "ERROR: c.toml: metrics.psnr.numerical.min.bf16 must be a finite number, got -inf*"),
    (b"[metrics.rel_l2.numerical]\nmax = nan\n", [], "ERROR: c.toml: metrics.rel_l2.numerical.max must be a number, got nan"),
    (b"[metrics.rel_l2.numerical]\nmax = 0.1 # caf\xe9\n", [],
     "ERROR: quality contract c.toml: not UTF-8 text (invalid continuation byte at byte *); save it as UTF-8"),
    (b"[metrics.rel_l2.numerical]\nmax = 0.1\n", ["--ditgate-class=exact"],
     "ERROR: quality contract c.toml has no rule for experiment class 'exact' (it covers: numerical)*"),
    (b"[metrics.rel_l2]\nnumerical = 3\n", [], "ERROR: c.toml: metrics.rel_l2.numerical must be a table*"),
    (b"[metrics.rel_l2.numerical]\nmaximum = 0.1\n", [],
     "ERROR: c.toml: unknown key metrics.rel_l2.numerical.'maximum' (allowed: required, cases, min, max, abs, rel, note)"),
    (b"[metrics.sharpness.numerical]\nmax = 0.1\n", [], "ERROR: c.toml: unknown metric 'metrics.sharpness'; known metrics: psnr*"),
])
def test_bad_contract_is_a_usage_error(pytester: pytest.Pytester, contract: bytes, args: list[str], message: str) -> None:
    pytester.makepyfile(test_contract=NEVER)
    (pytester.path / "c.toml").write_bytes(contract)
    _usage_error(pytester.runpytest("--ditgate", "-p", "no:cacheprovider", "--ditgate-contract=c.toml", *args), message)


def test_the_project_default_contract_must_cover_the_class(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_contract=NEVER)
    (pytester.path / "fixtures").mkdir()
    (pytester.path / "fixtures" / "quality_contract.toml").write_text("[metrics.rel_l2.numerical]\nmax = 0.1\n")
    _usage_error(pytester.runpytest("--ditgate", "-p", "no:cacheprovider", "--ditgate-class=quantization"),
                 "ERROR: quality contract fixtures/quality_contract.toml has no rule for experiment class 'quantization'*")


def test_shipped_default_contract_is_valid_and_covers_every_class() -> None:
    from pytest_ditgate.quality.contract import load_contract, packaged_contract_path
    from pytest_ditgate.quality.specs import EXPERIMENT_CLASSES

    text = packaged_contract_path().read_text(encoding="utf-8")
    contract = load_contract(packaged_contract_path())
    assert contract.covered() == list(EXPERIMENT_CLASSES)
    for field in ("range", "tile", "direction", "required", "kinds", "min / max", "abs / rel", "note"):
        assert f"#   {field}" in text, f"the shipped contract does not document {field}"


QUALITY = """
import pytest
import torch
from pytest_ditgate.errors import DitgateUsageError

def test_tensors(quality_gate):
    base = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    result = quality_gate.check("img0", base.clone(), base)
    assert result.passed and "img0.psnr" in result.metrics and "default_contract.toml" in result.contract

def test_mixed(quality_gate):
    quality_gate.check("img0", {"image": torch.zeros(1, 3, 8, 8)}, torch.zeros(1, 3, 8, 8))
"""


def test_quality_gate_takes_tensors_with_the_shipped_contract(pytester: pytest.Pytester) -> None:
    pytest.importorskip("torchmetrics")
    pytester.makepyfile(test_quality=QUALITY)
    result = pytester.runpytest("--ditgate", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["E   *DitgateUsageError: quality_gate.check('img0', candidate, baseline): give two tensors "
                                 "or two mappings of named tensors, got dict and Tensor",
                                 "FAILED test_quality.py::test_mixed - quality_gate.check('img0'*"])
    assert "quality_plugin.py:" not in result.stdout.str()  # no plugin frames in the report


def test_bad_lane_noise_floor_is_a_usage_error_in_advisory_runs(pytester: pytest.Pytester) -> None:
    """An advisory run of a declared lane uses the judge's floor, and refuses an invalid one as the judge does."""
    pytester.makepyfile(test_lane=NEVER)
    pytester.makepyprojecttoml('[tool.ditgate.lanes.fwd]\ntests = ["test_lane.py"]\nmin_improvement = "2%"\n')
    _usage_error(pytester.runpytest("--ditgate", "--ditgate-lane=fwd", "-p", "no:cacheprovider"),
                 "*[[]tool.ditgate.lanes.fwd[]] min_improvement must be a number in [[]0, 0.5), got '2%'*")
