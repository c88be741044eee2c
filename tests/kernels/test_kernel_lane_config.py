"""The kernel lane on a machine without a GPU: declared and valid, its seam reference right, its tests skipping
with the device's reason (it is judged on an NVIDIA GPU only: the GPU check's classes stage)."""

from __future__ import annotations

import ast
import fnmatch
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LANE_TESTS = ROOT / "tests" / "gates" / "kernels" / "test_kernel_lane.py"


def test_the_kernel_lane_is_declared_with_required_tests_that_exist() -> None:
    from pytest_ditgate.project_config import load_project_config
    from pytest_ditgate.verdict.lane import load_lane

    lane = load_lane(load_project_config(ROOT), "kernels")
    assert lane.tests == ("tests/gates/kernels/test_kernel_lane.py",) and lane.default_class == "numerical"
    names = [node.name for node in ast.parse(LANE_TESTS.read_text()).body if isinstance(node, ast.FunctionDef)]
    for pattern in lane.required:
        assert any(fnmatch.fnmatch(f"tests/gates/kernels/test_kernel_lane.py::{name}", pattern) for name in names)


def test_the_lane_reference_is_the_seam_the_kernels_compute() -> None:
    torch = pytest.importorskip("torch")
    from kernels import reference

    spec = importlib.util.spec_from_file_location("kernel_lane_tests", LANE_TESTS)
    lane_tests = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lane_tests)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(2, 2, 5, 16, dtype=torch.float64, generator=g)
    gate, scale, shift = torch.randn(3, 2, 16, dtype=torch.float64, generator=g)
    for got, want in zip(lane_tests.reference_seam(x, gate, y, scale, shift),
                         reference.gated_residual_layernorm_modulate_ref(x, gate, y, scale, shift)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_the_candidate_seam_names_its_kernels() -> None:
    from kernels import lane

    assert lane.SEAM in lane.SEAMS
    with pytest.raises(ValueError, match="unknown seam 'fast'; choose from separate, fused"):
        lane.seam_for("fast")


def test_the_lane_skips_on_a_machine_without_a_gpu() -> None:
    hidden = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # a GPU host (the GPU check) hides its device for it
    done = subprocess.run([sys.executable, "-m", "pytest", "--ditgate", "-p", "no:cacheprovider", "-q", "-rs",
                           str(LANE_TESTS.relative_to(ROOT))], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=hidden)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "3 skipped" in done.stdout and "kernels/ runs on CUDA (Ampere and newer)" in done.stdout
