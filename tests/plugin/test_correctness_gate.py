"""The kernel_check fixture in a pytest run: one planted bad candidate per reason code, honest ones pass."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

SUITE = '''
import functools, time
import pytest
import torch

def make_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(9, 13, generator=g, dtype=torch.float16), torch.randn(13, generator=g, dtype=torch.float16)

def reference(x, w):
    return torch.tanh(x * w) + x

def honest(x, w):
    return torch.tanh(x * w) + x

def test_honest(kernel_check):
    report = kernel_check(honest, reference, make_inputs, trials=3)
    assert report.passed and report.seeds == [0, 1, 2]

def test_mismatch(kernel_check):
    kernel_check(lambda x, w: torch.tanh(x * w) + x * 1.02, reference, make_inputs, label="scaled")

def test_zeros(kernel_check):
    kernel_check(lambda x, w: torch.zeros_like(x), reference, make_inputs, label="zeros")

def test_nonfinite(kernel_check):
    def kernel(x, w):
        out = honest(x, w)
        out[2, 5] = float("inf")
        return out
    kernel_check(kernel, reference, make_inputs)

def test_shape(kernel_check):
    kernel_check(lambda x, w: honest(x, w)[:, :12], reference, make_inputs)

def test_dtype(kernel_check):
    kernel_check(lambda x, w: honest(x.float(), w.float()), reference, make_inputs)

def test_input_mutated(kernel_check):
    def kernel(x, w):
        return x.mul_(w).tanh_().add_(x)
    kernel_check(kernel, reference, make_inputs)

def test_nondeterministic(kernel_check):
    calls = []
    def kernel(x, w):
        calls.append(1)
        out = honest(x.float(), w.float())
        return out + (len(calls) % 2) * 1e-6
    kernel_check(kernel, lambda x, w: honest(x, w), lambda s: tuple(t.float() for t in make_inputs(s)))

def test_nondeterminism_allowance(kernel_check):
    calls = []
    def kernel(x, w):
        calls.append(1)
        return honest(x.float(), w.float()) + (len(calls) % 2) * 1e-6
    inputs = lambda s: tuple(t.float() for t in make_inputs(s))
    report = kernel_check(kernel, honest, inputs, nondeterminism_atol=2e-6, input_scales=())  # absolute noise
    assert 0 < report.trials[0].nondeterminism <= 2e-6

def test_stale_output(kernel_check):
    def kernel(x, w):
        out = torch.empty_like(x)
        out[:-1] = honest(x[:-1], w)   # forgets the last row
        return out
    kernel_check(kernel, reference, make_inputs)

def test_constant_output(kernel_check):
    cache = {}
    def kernel(x, w):
        if "out" not in cache:
            cache["out"] = honest(x, w)
        return cache["out"].clone()
    kernel_check(kernel, reference, make_inputs)

def test_timer_tampered(kernel_check, monkeypatch):
    def kernel(x, w):
        monkeypatch.setattr(time, "perf_counter", lambda: 0.0)
        return honest(x, w)
    kernel_check(kernel, reference, make_inputs)

def test_timer_wrapped_synchronize(kernel_check, monkeypatch):
    real = torch.cuda.synchronize
    monkeypatch.setattr(torch.cuda, "synchronize", functools.wraps(real)(lambda *a, **k: None))
    kernel_check(honest, reference, make_inputs)

def test_crash(kernel_check):
    def kernel(x, w):
        raise RuntimeError("illegal memory access (planted)")
    kernel_check(kernel, reference, make_inputs)
'''

CONFTEST = '''
import pytest
from pytest_ditgate.correctness.plugin import kernel_checks_key

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "call":
        print(f"RECORD {item.name} {item.stash.get(kernel_checks_key, [])}")
'''

EXPECTED = {
    "test_mismatch": "mismatch",
    "test_zeros": "mismatch",
    "test_nonfinite": "nonfinite",
    "test_shape": "shape",
    "test_dtype": "dtype",
    "test_input_mutated": "input_mutated",
    "test_nondeterministic": "nondeterministic",
    "test_stale_output": "stale_output",
    "test_constant_output": "constant_output",
    "test_timer_tampered": "timer_tampered",
    "test_timer_wrapped_synchronize": "timer_tampered",
    "test_crash": "crash",
}


def _reports(pytester: pytest.Pytester):
    pytester.makepyfile(test_planted=SUITE)
    pytester.makeconftest(CONFTEST)
    result = pytester.runpytest("--ditgate", "-p", "no:randomly", "-s")
    calls = {r.nodeid.split("::")[-1]: r for r in result.reprec.getreports("pytest_runtest_logreport")
             if r.when == "call"}
    return result, calls


def test_each_planted_cheat_fails_with_its_reason_and_a_full_message(pytester: pytest.Pytester) -> None:
    result, calls = _reports(pytester)
    result.assert_outcomes(passed=2, failed=len(EXPECTED))
    for name, reason in EXPECTED.items():
        report = calls[name]
        assert report.failed, name
        text = str(report.longrepr)
        assert f"GateFailure: [{reason}]" in text, (name, text[-2000:])
        assert "repro: check_kernel(" in text and ("seed=0, trials=1" in text or "seed=1, trials=1" in text)
    # the kernel_check outcome of every call is on the item for the timing fixture
    out = result.stdout.str()
    assert "RECORD test_honest [('honest', True, None)]" in out
    assert "RECORD test_zeros [('zeros', False, 'mismatch')]" in out
    assert "RECORD test_crash [('test_crash.<locals>.kernel', False, 'crash')]" in out

    # the failure message names the check, trial and seed, shapes and dtypes, errors and a repro
    text = str(calls["test_mismatch"].longrepr)
    for part in ("kernel_check 'scaled' failed: mismatch: out differs from the reference beyond tolerance",
                 "(trial 1 of 5, seed 0; candidate ran before the reference)",
                 "inputs: arg0 float16[9, 13] on cpu; arg1 float16[13] on cpu",
                 "output out: candidate float16[9, 13] vs reference float64[9, 13]",
                 "max abs err", "max rel err", "rel-norm err", "worst at index (", "elements mismatch (", "norm bound failed", "x its bound", "honest-error estimate",
                 "reference computed in float64",
                 "repro: check_kernel(test_mismatch.<locals>.<lambda>, reference, make_inputs, seed=0, trials=1)"):
        assert part in text, (part, text[-2500:])
    constant = str(calls["test_constant_output"].longrepr)
    assert "identical to trial 1's" in constant and "seed 1;" in constant
    stale = str(calls["test_stale_output"].longrepr)
    assert "13 of 117 elements of out still hold the poison pattern" in stale
    timer = str(calls["test_timer_wrapped_synchronize"].longrepr)
    assert "tampered: torch.cuda.synchronize" in timer


def test_kernel_check_is_skipped_without_ditgate(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_planted=SUITE)
    result = pytester.runpytest("-rs", "-k", "honest")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*gates are off*"])


def test_trials_and_seed_options_set_defaults(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_planted=SUITE + '''
def test_defaults(kernel_check):
    report = kernel_check(honest, reference, make_inputs)
    assert report.seeds == [7, 8]
    assert kernel_check(honest, reference, make_inputs, trials=1, seed=0).seeds == [0]
''')
    result = pytester.runpytest("--ditgate", "-k", "defaults", "--ditgate-kernel-trials", "2",
                                "--ditgate-kernel-seed", "7")
    result.assert_outcomes(passed=1)
    bad = pytester.runpytest("--ditgate", "--ditgate-kernel-trials", "0")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
