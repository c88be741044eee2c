"""Honest pairs still pass under the pair's audits: a real speedup, outputs that differ by summation order,
microsecond calls, closures and size arguments, an op whose inputs must keep their exact values, and pairs
under ``-n 2``; outputs that cannot be compared are said to be "not compared" in the summary and the ledger.

Every run goes through ``runpytest_subprocess`` (see test_bench_fixture.py).
"""

from __future__ import annotations

import pytest

from pytest_ditgate.fsutil import read_jsonl

from host_only import no_cuda  # noqa: F401 - a fixture: the suites below time host code, as on a CPU machine

RUN = ("--ditgate", "--ditgate-bench-budget-ms=60", "-p", "no:benchmark", "-p", "no:cacheprovider")

HONEST = """
import torch

X, W = torch.randn(256, 512), torch.randn(512, 256)
V = 1.5 + 0.5 * torch.rand(48)  # diag(V - 1) is positive definite only while no element of V shrinks


def reference(x, w):
    return x @ w


def four_times(x, w):
    for _ in range(4):
        out = x @ w
    return out


def chunked(x, w):  # the same product summed in another order
    return sum(x[:, k:k + 64] @ w[k:k + 64] for k in range(0, x.shape[1], 64))


def test_a_real_speedup(ditbench):
    c = ditbench.pair(reference, four_times, X, W, min_speedup=0.3, budget_ms=200)  # 4x, with room for noise
    assert c.checks["outputs"] == "outputs agree" and c.checks["audited_calls"] >= 1


def test_summation_order(ditbench):
    ditbench.pair(chunked, reference, X, W, min_speedup=None)


# min_speedup=None where the speeds are alike: a loaded host's noise is not what these tests are about
def test_microseconds(ditbench):
    x, y = torch.randn(64), torch.randn(64)
    c = ditbench.pair(torch.add, lambda a, b: a + b, x, y, min_speedup=None)
    assert c.checks["outputs"] == "outputs agree" and c.a.n >= 10


def test_closures(ditbench):
    c = ditbench.pair(lambda: X @ W, lambda: torch.mm(X, W), min_speedup=None)
    assert c.checks["outputs"] == "outputs agree"


def test_a_size_argument(ditbench):
    ditbench.pair(lambda n: torch.full((n, n), 2.0), lambda n: torch.ones(n, n) * 2, 64, min_speedup=None)


def test_inputs_whose_exact_values_matter(ditbench):
    c = ditbench.pair(lambda v: torch.linalg.cholesky(torch.diag(v - 1)),
                      lambda v: torch.linalg.cholesky(torch.diag(v - 1).double()).float(), V, min_speedup=None)
    assert c.checks["outputs"] == "outputs agree"


def test_exact_copies_on_request(ditbench):
    c = ditbench.pair(chunked, reference, X, W, min_speedup=None, perturb=False)
    assert c.checks["inputs"] == "fresh copies"


def test_outputs_that_are_not_tensors(ditbench):
    ditbench.pair(lambda n: sum(range(n)), lambda n: sum(range(n)), 2000, min_speedup=None)
"""


@pytest.mark.usefixtures("no_cuda")
def test_honest_pairs_pass_and_the_record_says_what_was_compared(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_honest=HONEST)
    result = pytester.runpytest_subprocess(*RUN)
    result.assert_outcomes(passed=8)
    result.stdout.fnmatch_lines_random([
        "test_a_real_speedup: candidate / reference ratio *, needs <= 0.7000 PASS",
        "test_closures: candidate / reference ratio *judged by the lane (min_speedup=None: no bound in this run)",
        "test_outputs_that_are_not_tensors: candidate / reference ratio *judged by the lane*; outputs are not "
        "tensors: not compared",
    ])
    assert result.stdout.str().count("not compared") == 1  # only the pair whose outputs are ints
    records, bad = read_jsonl(pytester.path / ".ditgate" / "bench.jsonl")
    assert bad == []
    checks = {r["test"].rsplit("::", 1)[-1]: r["comparison"]["checks"] for r in records}
    assert checks["test_outputs_that_are_not_tensors"]["outputs"] == "outputs are not tensors: not compared"
    assert checks["test_summation_order"] == {"outputs": "outputs agree", "inputs": "fresh copies, one element of "
                                              "each floating argument changed",
                                              "audited_calls": checks["test_summation_order"]["audited_calls"]}
    assert checks["test_inputs_whose_exact_values_matter"]["inputs"].startswith("fresh copies (exact: the reference "
                                                                                "raised")
    assert all(c["audited_calls"] >= 1 for c in checks.values())


XDIST = """
import torch

X, W = torch.randn(128, 256), torch.randn(256, 128)


def test_one(ditbench):
    ditbench.pair(lambda x, w: x @ w, lambda x, w: (x @ w).clone(), X, W, min_speedup=-0.9)


def test_two(ditbench):
    ditbench.pair(lambda x: x.relu(), lambda x: x.clamp(min=0), X, min_speedup=-0.9)
"""


@pytest.mark.slow  # xdist workers each import torch
@pytest.mark.usefixtures("no_cuda")
def test_honest_pairs_pass_under_two_xdist_workers(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    pytester.makepyfile(test_xdist=XDIST)
    result = pytester.runpytest_subprocess(*RUN, "-n", "2")
    result.assert_outcomes(passed=2)
