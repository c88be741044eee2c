"""The kernel lane (``[tool.ditgate.lanes.kernels]``): the candidate seam of ``kernels/lane.py`` against a PyTorch
reference of the same arithmetic, judged by ``ditgate experiment --lane kernels`` (docs/agent_loop.md).

Quality: the seam's two outputs at DiT-XL/2's width in bf16, against the goldens ``ditgate baseline --lane
kernels`` froze on this device kind, under the quality contract of the run's class. Speed: the seam against
the PyTorch reference (eager: a residual, a LayerNorm, a modulation), interleaved in the same run, and against
the lane best's seam. The kernels are CUDA only: on a machine without an NVIDIA GPU of sm_80+ every test here
skips, and the lane cannot be baselined there.
"""

from __future__ import annotations

import pytest

from pytest_ditgate.verdict.lane import LANE_BEST_LABEL

pytestmark = pytest.mark.requires_gpu(cc=">=8.0", bf16=True, why="kernels/ runs on CUDA (Ampere and newer)")

#: the timed seam: batch 32 x 1024 tokens (DiT-XL/2 at 512 px) x hidden 1152, bf16 (memory-bound); the judged
#: one is smaller (its two outputs are the golden: 1.2 MB)
SHAPE, JUDGED_SHAPE = (32, 1024, 1152), (4, 64, 1152)
EPS = 1e-6
CASE = "kernels-seam-bf16"

_cache: dict[str, object] = {}


def seam_inputs(seed: int = 0, shape: tuple[int, int, int] = SHAPE):
    """x, gate, y, scale, shift on CUDA in bf16; the modulation rows are chunks of one [B, 6H] adaLN output."""
    import torch

    b, n, h = shape
    g = torch.Generator("cuda").manual_seed(seed)
    x = torch.randn(b, n, h, device="cuda", dtype=torch.bfloat16, generator=g)
    y = torch.randn(b, n, h, device="cuda", dtype=torch.bfloat16, generator=g)
    rows = torch.randn(b, 6 * h, device="cuda", dtype=torch.bfloat16, generator=g).chunk(6, dim=1)
    return x, rows[2], y, rows[4], rows[3]


def reference_seam(x, gate, y, scale, shift, eps=EPS):
    """The seam in PyTorch ops, as diffusers' DiT block computes it (the lane's baseline implementation)."""
    import torch.nn.functional as F

    x_new = gate[:, None] * y + x
    return x_new, F.layer_norm(x_new, x_new.shape[-1:], eps=eps) * (1 + scale[:, None]) + shift[:, None]


def seam_module():
    """The candidate seam inside a ``torch.nn.Module``: what the judge scans (it runs no GEMM and holds no
    weight, so the module is all there is to observe besides its ops)."""
    import torch

    from kernels import lane

    if "module" not in _cache:
        class Seam(torch.nn.Module):
            def forward(self, *args):
                return lane.seam(*args)

        _cache["module"] = Seam()
    return _cache["module"]


def test_seam_quality(golden, quality_gate, ditgate_candidate) -> None:
    module = seam_module()
    ditgate_candidate.declare(module)
    import torch

    with torch.no_grad():
        x_new, out = module(*seam_inputs(0, JUDGED_SHAPE))
    tensors = {"x_new": x_new, "out": out}
    kinds = {name: "activation" for name in tensors}

    def compare(candidate, hit):
        __tracebackhide__ = True
        return quality_gate.check(CASE, candidate, hit.tensors, tolerance_scale=hit.tolerance_scale, kinds=kinds)

    outcome = golden.check(CASE, tensors, device="cuda", compare=compare)
    assert outcome.status in ("matched", "written"), f"no golden to judge the candidate by ({outcome.status})"


def test_seam_speed(ditbench) -> None:
    import torch

    with torch.no_grad():
        ditbench.pair(seam_module(), reference_seam, *seam_inputs(1), min_speedup=None, mechanism="events",
                      budget_ms=1500, labels=("candidate", "pytorch"))


def test_seam_versus_lane_best(ditbench, ditgate_lane) -> None:
    import torch

    from kernels import lane

    ditgate_lane.record_config({"seam": lane.SEAM})
    recorded = (ditgate_lane.best_config or {}).get("seam")
    if recorded is None:
        pytest.skip("no lane best with a recorded seam to re-measure yet")
    with torch.no_grad():
        ditbench.pair(seam_module(), lane.seam_for(recorded), *seam_inputs(2), min_speedup=None, mechanism="events",
                      budget_ms=1500, labels=("candidate", LANE_BEST_LABEL))
