"""Each experiment class's honest and harmful candidate through the DiT lane's quality tests on the CPU, against
the committed goldens (the judge's verdicts on the same candidates: scripts/agent_loop_classes.py).

Each run is ``pytest --ditgate --ditgate-class=<claimed>`` of the lane's own test file, in a process whose
candidate (``dit_impl/fast/candidate.py``) a small plugin changes first, as an experiment's commit would. The
harmful candidate of each class fails, judged as its class (a changed sampling or low-bit weights claimed as
numerical included); the honest one is judged, not crashed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("diffusers")
ROOT = Path(__file__).resolve().parents[2]
LANE = "tests/gates/dit/test_candidate_lane.py"
TINY = f"{LANE}::test_tiny_candidate_quality[tiny-ddim-8]"
SHAPES = f"{LANE}::test_shapes_candidate_quality[shapes-ddim-20]"

SCALE_BUG = """
import dit_impl.fast.model as model
import torch.nn.functional as F
model.sdpa = lambda q, k, v, backend: F.scaled_dot_product_attention(q, k, v, scale=1.02 * q.shape[-1] ** -0.5)
"""

#: (id, the candidate's change, tests, claimed class, passes, words in the output)
CANDIDATES = [
    ("numerical-fp16", 'candidate.OPTIONS = candidate.OPTIONS.replace(dtype="float16")', [TINY], "numerical", True,
     []),  # the CPU lane runs float32 (options_for): judged like the baseline
    ("numerical-harmful-logit-scale", SCALE_BUG, [TINY], "numerical", False, ["(numerical, fp32"]),
    ("approximate-a-fifth-of-the-steps", "candidate.SAMPLER = SamplerOptions(step_fraction=0.2)", [TINY, SHAPES],
     "approximate", True, ["tiny-ddim-8: judged on shapes and finiteness only"]),
    ("approximate-harmful-2-steps-claimed-numerical", "candidate.SAMPLER = SamplerOptions(steps=2)", [SHAPES],
     "numerical", False, ["(approximate, fp32", "class_accuracy"]),
    ("quantization-fp8-emulated", 'candidate.OPTIONS = candidate.OPTIONS.replace(quant="fp8")', [TINY],
     "quantization", True, []),
    ("quantization-int8-weights", 'candidate.OPTIONS = candidate.OPTIONS.replace(quant="int8_weight")', [TINY],
     "quantization", True, []),
    ("quantization-harmful-int4-claimed-numerical", 'candidate.OPTIONS = candidate.OPTIONS.replace(quant="int4_noscale")',
     [TINY], "numerical", False, ["(quantization, fp32", "latents.rel_l2"]),
]


@pytest.mark.slow
@pytest.mark.parametrize("change, tests, claimed, passes, words", [c[1:] for c in CANDIDATES],
                         ids=[c[0] for c in CANDIDATES])
def test_the_lane_judges_each_class(tmp_path: Path, change, tests, claimed, passes, words) -> None:
    (tmp_path / "class_candidate.py").write_text(
        "import dit_impl.fast.candidate as candidate\nfrom dit_impl.fast.sampler import SamplerOptions\n" + change)
    # this process's environment (the GPU check's recorder on PYTHONPATH included), without ditgate or pytest
    # switches, with the candidate's change importable
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DITGATE_", "PYTEST_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [str(tmp_path), str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]))
    done = subprocess.run([sys.executable, "-m", "pytest", "--ditgate", f"--ditgate-class={claimed}",
                           "-p", "class_candidate", "-p", "no:cacheprovider", "-q", "-rA", *tests],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    out = done.stdout + done.stderr
    assert done.returncode == (0 if passes else 1), out[-4000:]
    assert "error" not in out.splitlines()[-1], out[-3000:]  # judged: passed or failed, never an error
    for word in words:
        assert word in out, (word, out[-4000:])
