"""Red-team round on the judge's classes, the honest side: refactors that keep the arithmetic's class (an einsum,
a multiply-and-sum, a GEMM in numpy on float weights, uint8 masks and index buffers beside a module's weights) are
judged at the class they claim; none is read as quantized. The project is baselined once per module."""

from __future__ import annotations

from pathlib import Path

import pytest

from rt_classes_candidates import HONEST, baselined, judge

pytestmark = pytest.mark.slow

CASES = ("einsum_refactor", "mul_sum_float_weights", "numpy_float_weights", "uint8_mask_and_index_buffers")


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return baselined(tmp_path_factory.mktemp("rt-honest"))


@pytest.mark.parametrize("name", CASES)
def test_an_honest_refactor_keeps_its_class(template: Path, tmp_path: Path, name: str) -> None:
    body, claim, real = HONEST[name]
    result, verdict = judge(template, tmp_path / "project", name, body, claim)
    assert verdict["classification"]["effective"] == real, verdict["classification"]
    assert verdict["classification"]["evidence"] == [], verdict["classification"]
    assert result.returncode in (0, 11), result.stdout[-3000:]  # the speed decides on a loaded host, never 10/12
