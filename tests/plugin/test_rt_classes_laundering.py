"""Red-team round on the judge's classes: int8 weights the GEMM observer never sees are still found, wherever the
candidate keeps them, and the candidate is judged as ``quantization`` whatever it claims.

Each candidate (tests/plugin/rt_classes_candidates.py) claims ``numerical``, runs a quarter of the baseline's work
and computes with int8 weights (rel-L2 0.007 from the baseline: inside the toy contract's ``numerical`` 0.05,
outside its ``quantization`` 1e-4), so judged at its claim it would be kept, and judged at what it is it is 10.
The project is baselined once per module.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rt_classes_candidates import LAUNDERING, baselined, judge

pytestmark = pytest.mark.slow

#: one candidate per hiding place, with the evidence that must name it (a numpy array's and rounded activations'
#: are test_rt_classes_observe.py's, to keep this file's judged runs few)
CASES = {
    "global_float_grid_mul_sum": "candidate.work.WQ (float32, shape (256, 256)): values on a grid",
    "python_ints_mul_sum": "Laundered.ints is a list of 65536 ints",
    "list_int8_mul_sum": "Laundered.parts[0] holds int8 values",
    "thread_closure_int8": "Laundered.fn closure 0 holds int8 values",
    "dithered_grid_parameter": "Linear.weight (float32, shape (256, 256)): values on a grid",
    "per_call_rounded_weights": "round to signed integer levels (256, 256)",
}


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return baselined(tmp_path_factory.mktemp("rt-classes"))


@pytest.mark.parametrize("name", sorted(CASES))
def test_hidden_int8_weights_are_judged_as_quantization(template: Path, tmp_path: Path, name: str) -> None:
    body, claim, real = LAUNDERING[name]
    result, verdict = judge(template, tmp_path / "project", name, body, claim)
    assert verdict["classification"]["effective"] == real, verdict["classification"]
    assert any(CASES[name] in e for e in verdict["classification"]["evidence"]), verdict["classification"]["evidence"]
    assert result.returncode == 10, result.stdout[-3000:]
    assert "fails its golden under class quantization" in str(verdict["verdict"]["reasons"])
