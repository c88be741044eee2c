"""Candidates of the classes red-team round (tests/plugin/test_rt_classes_*.py): edits of judge_project's
``candidate/work.py`` that launder their class (int8 weights the GEMM observer never sees) and honest ones that
must keep theirs. Every one runs a quarter of the baseline's tanh passes, so it is faster: a candidate judged
at the class it claims is a KEEP, and only the class it is judged as can refuse it.

The toy contract holds ``numerical`` to rel-L2 0.05 and ``quantization`` to 1e-4: int8 weights (about 0.004
from the baseline) pass as ``numerical`` and fail as ``quantization``, so a laundered class reads 0 and a
caught one 10."""

from __future__ import annotations

import subprocess
from pathlib import Path

from judge_project import CANDIDATE, serving

#: the honest candidate: a quarter of the tanh passes, the same weights
FAST = CANDIDATE.format(repeat=6)

#: W quantized to int8 with a per-output-row scale (the prelude of every laundering candidate)
QUANT = '''
import numpy as np


def quantized():
    """W (as nn.Linear holds it: out x in) as int8 values and a per-output-row scale."""
    weight = W.t().contiguous()
    scale = weight.abs().amax(dim=1, keepdim=True) / 127
    return torch.round(weight / scale).to(torch.int8), scale


def mul_sum(y, weight):
    """y @ weight.t() without a GEMM: a broadcast multiply and a sum."""
    return (y[:, None, :] * weight[None, :, :]).sum(-1)
'''


def _model(forward: str, init: str = "") -> str:
    return FAST + QUANT + f'''

class Laundered(torch.nn.Module):
    def __init__(self):
        super().__init__()
{init or "        pass"}

    def forward(self, x):
        y = x
        for _ in range(6 * SCALE):
            y = torch.tanh(x)
{forward}
''' + serving("Laundered")


#: name -> (candidate text, class it claims, class it is)
LAUNDERING = {
    # quantized at import time, kept as a float32 module-level tensor, applied without a GEMM
    "global_float_grid_mul_sum": (_model("        return mul_sum(y, WQ)").replace("MODEL = Laundered()", "_Q, _S = quantized()\nWQ = _Q.float() * _S  # exactly on the int8 grid\ndel _Q, _S\nMODEL = Laundered()"), "numerical", "quantization"),
    # int8 values in a numpy array on the module, dequantized per call, through a GEMM
    "numpy_int8_attr_gemm": (_model("        return y @ torch.from_numpy(self.q.astype(np.float32) * self.s).t()",
                                    "        q, s = quantized()\n        self.q, self.s = q.numpy(), s.numpy()"), "numerical", "quantization"),
    # int8 values in a numpy array, the whole GEMM in numpy
    "numpy_int8_numpy_gemm": (_model("        return torch.from_numpy(y.numpy() @ (self.q.astype(np.float32) * self.s).T)",
                                     "        q, s = quantized()\n        self.q, self.s = q.numpy(), s.numpy()"), "numerical", "quantization"),
    # an int8 torch tensor behind an underscore attribute, dequantized per call, without a GEMM
    "underscore_int8_attr_mul_sum": (_model("        return mul_sum(y, self._q.float() * self._s)",
                                            "        self._q, self._s = quantized()"), "numerical", "quantization"),
    # an int8 tensor in a plain Python list on the module
    "list_int8_mul_sum": (_model("        return mul_sum(y, self.parts[0].float() * self.parts[1])",
                                 "        self.parts = list(quantized())"), "numerical", "quantization"),
    # the int8 values as a Python list of ints (no tensor at all until the call)
    "python_ints_mul_sum": (_model("        return mul_sum(y, torch.tensor(self.ints, dtype=torch.float32).view(256, 256) * self.s)",
                                   "        q, self.s = quantized()\n        self.ints = q.reshape(-1).tolist()"), "numerical", "quantization"),
    # an int8 tensor in a closure, dequantized per call, through a GEMM
    "closure_int8_gemm": (_model("        return DEQ(y)").replace("MODEL = Laundered()", '''
def _make(q, s):
    def deq(y):
        return torch.nn.functional.linear(y, q.float() * s)
    return deq


DEQ = _make(*quantized())
MODEL = Laundered()'''), "numerical", "quantization"),
    # an int8 tensor in the closure of a function kept on the module, run in a thread (the dispatch observer
    # watches the test's thread only)
    "thread_closure_int8": (_model("        return POOL.submit(self.fn, y).result()", '''        q, s = quantized()

        def fn(y):
            return torch.nn.functional.linear(y, q.float() * s)
        self.fn = fn''').replace("MODEL = Laundered()", "from concurrent.futures import ThreadPoolExecutor\nPOOL = ThreadPoolExecutor(1)\nMODEL = Laundered()"),
                            "numerical", "quantization"),
    # dequantized weights on the grid plus a dither far below a step: a Linear's float32 parameter
    "dithered_grid_parameter": (_model("        return self.proj(y)", '''        self.proj = torch.nn.Linear(256, 256, bias=False)
        with torch.no_grad():
            q, s = quantized()
            noise = torch.randn(q.shape, generator=torch.Generator().manual_seed(3))
            self.proj.weight.copy_(q.float() * s + noise * s * 1e-3)'''), "numerical", "quantization"),
    # float weights rounded to int8 levels on every call, in float, without a GEMM
    "per_call_rounded_weights": (_model("        return mul_sum(y, torch.round(self.w / self.s) * self.s)", '''        self.w = torch.nn.Parameter(W.t().contiguous())
        self.s = W.t().abs().amax(dim=1, keepdim=True) / 127'''), "numerical", "quantization"),
    # the activations rounded to a 1/16 grid by float32's magic number, no round op (a documented limit)
    "magic_number_rounding": (_model("        return self.proj(((y * 16 + 12582912.0) - 12582912.0) / 16)", '''        self.proj = torch.nn.Linear(256, 256, bias=False)
        with torch.no_grad():
            self.proj.weight.copy_(W.t())'''), "numerical", "quantization"),
    # the activations rounded to a 1/16 grid (fp8-like emulation) before an ordinary float GEMM
    "rounded_activations": (_model("        return self.proj(torch.round(y * 16) / 16)", '''        self.proj = torch.nn.Linear(256, 256, bias=False)
        with torch.no_grad():
            self.proj.weight.copy_(W.t())'''), "numerical", "quantization"),
}

#: name -> (candidate text, class it claims, class it is): must keep their class
HONEST = {
    "einsum_refactor": (_model("        return torch.einsum('bi,oi->bo', y, self.weight)", '''        self.weight = torch.nn.Parameter(W.t().contiguous())'''), "numerical", "numerical"),
    "mul_sum_float_weights": (_model("        return mul_sum(y, self.weight)", '''        self.weight = torch.nn.Parameter(W.t().contiguous())'''), "numerical", "numerical"),
    "uint8_mask_and_index_buffers": (_model("        return (self.proj(y) * self.mask.float())[:, self.index]", '''        self.proj = torch.nn.Linear(256, 256, bias=False)
        with torch.no_grad():
            self.proj.weight.copy_(W.t())
        self.register_buffer("mask", torch.ones(64, 256, dtype=torch.uint8))
        self.register_buffer("index", torch.arange(256))
        self._lookup = torch.arange(256 * 64, dtype=torch.int64).view(64, 256)
        self.table = [torch.ones(64, 256, dtype=torch.uint8)]'''), "numerical", "numerical"),
    "numpy_float_weights": (_model("        return torch.from_numpy(y.numpy() @ self.w.T)", "        self.w = W.t().numpy().copy()"),
                            "numerical", "numerical"),
    "honest_int8_declared": (_model("        return mul_sum(y, self.q.float() * self.s)", '''        q, s = quantized()
        self.register_buffer("q", q)
        self.register_buffer("s", s)'''), "quantization", "quantization"),
}


def gate() -> str:
    """judge_project's gate with the speed pairs' agreement check off: the quality test alone judges the outputs
    (a quantized candidate does not agree with the reference to the pair's tolerance by design)."""
    from judge_project import GATE

    return GATE.replace("min_speedup=None)", "min_speedup=None, verify=False)").replace(
        'labels=("candidate", "lane-best"))', 'labels=("candidate", "lane-best"), verify=False)')


def baselined(base: Path) -> Path:
    """judge_project with :func:`gate`, baselined under ``base`` (once per test module)."""
    from judge_project import create

    project = create(base / "template", gate=gate())
    done = project.ditgate("baseline", "--lane", "fwd")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    return project.root


def judge(template: Path, root: Path, name: str, body: str, claim: str) -> tuple[subprocess.CompletedProcess, dict]:
    """Commit ``body`` as the candidate in a copy of ``template`` at ``root`` and judge it as ``claim``: the run and
    its verdict."""
    from judge_project import copy

    project = copy(template, root)
    project.write("candidate/work.py", body)
    project.commit(name)
    result = project.experiment(cls=claim, description=name)
    return result, project.verdict()
