"""The README's Python examples stay executable (issue 37): every ```python block in README.md carries an
``<!-- example: ... -->`` line saying whether it is a test file or a fragment, and each one runs here with
pytester, on the CPU, with stand-ins only for what the reader supplies (their kernel module, their timed
functions). What a CPU cannot run (CUDA inputs) is checked for what a CPU does with it: a reasoned skip,
and with a GPU profile the one-line failure; the same code with its inputs on the CPU passes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCK = re.compile(r"(?:<!-- example: (?P<kind>[^>]*?) -->\n)?```python\n(?P<code>.*?)```", re.S)


def _examples() -> dict[str, str]:
    """Each marked block by the first words of its marker; an unmarked python block fails the test."""
    found: dict[str, str] = {}
    for match in BLOCK.finditer(README.read_text(encoding="utf-8")):
        kind = match.group("kind")
        assert kind is not None, f"README python block without an <!-- example: ... --> marker:\n{match['code'][:200]}"
        assert kind.startswith(("a test file", "a fragment")), kind
        found[match.group("code").splitlines()[2 if kind.startswith("a test file") else 0]] = match.group("code")
    return found


def _example(first_line_part: str) -> str:
    (code,) = [code for first, code in _examples().items() if first_line_part in code]
    return code


def test_every_python_block_of_the_readme_is_marked() -> None:
    assert len(_examples()) == 3  # markers, kernel_check, timing: a new block needs its marker and a run here


def test_the_marker_example_skips_with_its_reasons_on_a_cpu(pytester: pytest.Pytester, use_profile) -> None:
    use_profile("cpu")
    pytester.makepyfile(test_markers=_example("requires_gpu(cc=\">=8.9\", why=\"fp8\")"))
    result = pytester.runpytest("--ditgate", "-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*needs a CUDA GPU with sm>=8.9 for fp8; device is cpu*",
                                 "*needs a CUDA GPU with 20 GB of device memory, bf16, the flash SDPA backend; device is cpu*"], consecutive=False)
    use_profile("a5500")  # the README's own comment: on an A5500 the fp8 test says why it is skipped
    result = pytester.runpytest("--ditgate", "-rs", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*needs sm>=8.9 for fp8; device is sm_86 (NVIDIA RTX A5500)*"])


MY_KERNELS = """
import torch

def fused_rmsnorm(x, w):  # a stand-in for the reader's kernel: the same math in float32, cast back
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(x.dtype)
"""


def test_the_kernel_check_example_runs(pytester: pytest.Pytester, use_profile) -> None:
    torch = pytest.importorskip("torch")
    code = _example("from my_kernels import fused_rmsnorm")
    pytester.makepyfile(my_kernels=MY_KERNELS, test_rmsnorm=code)
    use_profile(None)
    result = pytester.runpytest("--ditgate", "-rs", "-p", "no:cacheprovider")
    if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        result.assert_outcomes(passed=1)
        return
    result.assert_outcomes(skipped=1)  # CUDA inputs: a CPU skips it, saying which requirement is missing
    result.stdout.fnmatch_lines(["*needs a CUDA GPU*bf16*device is cpu*"])
    # the same example with its inputs on the CPU passes: the README's reference and make_inputs are right
    assert code.count('device="cuda"') == 2 and code.count("@pytest.mark.requires_gpu(bf16=True)") == 1
    on_cpu = code.replace('device="cuda"', 'device="cpu"').replace("@pytest.mark.requires_gpu(bf16=True)\n", "")
    pytester.makepyfile(test_rmsnorm=on_cpu)
    pytester.runpytest("--ditgate", "-p", "no:cacheprovider").assert_outcomes(passed=1)


STAND_INS = """
def fn(x):                  # the reader's functions: a slow and a fast way to sum
    return sum(range(x))

def candidate(x):
    return sum(range(x // 20))

reference = fn
x = 20000
"""


def test_the_timing_fragment_runs_with_stand_ins(pytester: pytest.Pytester) -> None:
    """A subprocess: in-process runs of ditbench crashed CPython here (see test_bench_fixture.py)."""
    code = _example("m = measure(fn, x, mechanism=\"auto\")")
    tail = """
def test_module_level_results():
    assert m.mechanism == "wall" and m.median_ms > 0 and m.n >= 10
    assert c.ratio < 1 and c.ci_low <= c.ratio <= c.ci_high
"""
    pytester.makepyfile(test_timing=STAND_INS + code + tail)
    result = pytester.runpytest_subprocess("--ditgate", "-p", "no:cacheprovider", "-p", "no:benchmark",
                                           "--ditgate-bench-budget-ms=20")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_fast_path: candidate / reference ratio *, needs <= 0.9500 PASS; outputs are "
                                 "not tensors: not compared"])  # the stand-ins return ints
