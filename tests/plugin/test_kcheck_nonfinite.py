"""``nonfinite="match"``: a reference's NaN and infinities as expected values, matched element for element.

A causally masked ``log_softmax`` is -inf at the masked positions, an attention's log-sum-exp is -inf on a row
with no key, a max must propagate a NaN input: such a reference failed ``reference_nonfinite`` even against
itself, with advice to draw inputs inside its domain. Declared, the candidate must return the same non-finite
value at the same elements, and the finite elements are compared as usual with bounds over them alone. A
candidate that masks with -1e30, one position late or early, with NaN for -inf, that leaves the masked elements
unwritten, that returns 0 for a row with no key, or that drops a NaN fails, naming the element; undeclared,
the message names the declaration where the reference's non-finite values are infinities.
"""

from __future__ import annotations

import pytest

from kcheck_suites import run_suite

torch = pytest.importorskip("torch")

from pytest_ditgate import GateFailure, check_kernel  # noqa: E402
from pytest_ditgate.correctness.inputs import make_tensor  # noqa: E402
from pytest_ditgate.errors import DitgateUsageError  # noqa: E402

KERNELS = '''
import math
import pytest
import torch
from pytest_ditgate.correctness.inputs import make_tensor


def causal(x, k=1):
    return torch.ones(x.shape[-2], x.shape[-1], dtype=torch.bool).triu(k)


def masked_log_softmax(x):
    return torch.log_softmax(x.masked_fill(causal(x), float("-inf")), -1)


def fused_log_softmax(x):                       # HONEST: fp32 math, its own max and log-sum-exp
    xf = x.float().masked_fill(causal(x), float("-inf"))
    m = xf.amax(-1, keepdim=True)
    return (xf - m - (xf - m).exp().sum(-1, keepdim=True).log()).to(x.dtype)


def big_negative_mask(x):                       # WRONG: masks with -1e30, finite where the reference is -inf
    return torch.log_softmax(x.float().masked_fill(causal(x), -1e30), -1).to(x.dtype)


def mask_one_late(x):                           # WRONG: the mask one position late
    return torch.log_softmax(x.float().masked_fill(causal(x, 2), float("-inf")), -1).to(x.dtype)


def mask_one_early(x):                          # WRONG: masks the diagonal too (-inf where the reference is finite)
    mask = causal(x, 0)
    mask[0, 0] = False
    return torch.log_softmax(x.float().masked_fill(mask, float("-inf")), -1).to(x.dtype)


def nan_for_inf(x):                             # WRONG: NaN at the masked positions
    return fused_log_softmax(x).masked_fill(causal(x), float("nan"))


def masked_unwritten(x):                        # WRONG: writes only the unmasked elements
    out = torch.empty(x.shape, dtype=x.dtype)
    keep = ~causal(x)
    out[keep] = fused_log_softmax(x)[keep]
    return out


def rows(dtype):
    return lambda seed: (make_tensor((128, 128), dtype, seed=seed),)


def test_against_itself(kernel_check):
    kernel_check(masked_log_softmax, masked_log_softmax, rows("float32"), nonfinite="match", label="self")


def test_fused_fp32(kernel_check):
    kernel_check(fused_log_softmax, masked_log_softmax, rows("float32"), nonfinite="match", seed=20)


def test_fused_bf16(kernel_check):
    kernel_check(fused_log_softmax, masked_log_softmax, rows("bfloat16"), nonfinite="match", label="fused_bf16")


@pytest.mark.parametrize("kernel", [big_negative_mask, mask_one_late, mask_one_early, nan_for_inf, masked_unwritten])
def test_wrong_masks(kernel_check, kernel):
    kernel_check(kernel, masked_log_softmax, rows("float32"), nonfinite="match")


def test_undeclared(kernel_check):
    kernel_check(masked_log_softmax, masked_log_softmax, rows("float32"), label="undeclared")


def padded_scores(seed):                        # batch 4 x 32 queries x 48 keys; batch b has 8*b keys, b=0 none
    q = make_tensor((4, 32, 16), "float32", seed=seed)
    k = make_tensor((4, 48, 16), "float32", seed=seed + 1)
    lengths = torch.tensor([0, 8, 16, 48])
    return q, k, lengths


def lse_reference(q, k, lengths):
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    padded = torch.arange(k.shape[1])[None, None, :] >= lengths[:, None, None]
    return torch.logsumexp(scores.masked_fill(padded, float("-inf")), -1)


def lse_online(q, k, lengths):                  # HONEST: a flash-style running max and sum over key blocks
    m = torch.full(q.shape[:2], float("-inf"))
    s = torch.zeros(q.shape[:2])
    for start in range(0, k.shape[1], 16):
        block = q @ k[:, start:start + 16].transpose(-1, -2) / math.sqrt(q.shape[-1])
        keys = torch.arange(start, start + block.shape[-1])
        block = block.masked_fill(keys[None, None, :] >= lengths[:, None, None], float("-inf"))
        new = torch.maximum(m, block.amax(-1))
        safe = torch.where(torch.isinf(new), torch.zeros_like(new), new)
        s = s * torch.exp(m - safe) + torch.exp(block - safe[..., None]).sum(-1)
        m = new
    return torch.where(torch.isinf(m), m, m + torch.log(s))


def lse_zero_for_empty_rows(q, k, lengths):     # WRONG: 0 where a row has no key (the reference says -inf)
    out = lse_online(q, k, lengths)
    return torch.where(torch.isinf(out), torch.zeros_like(out), out)


def test_lse_online(kernel_check):
    kernel_check(lse_online, lse_reference, padded_scores, nonfinite="match")


def test_lse_zero_for_empty_rows(kernel_check):
    kernel_check(lse_zero_for_empty_rows, lse_reference, padded_scores, nonfinite="match")


def with_nans(seed):                            # NaN inputs: a max must propagate them
    x = make_tensor((64, 256), "float32", seed=seed)
    x[seed % 64, (7 * seed) % 256] = float("nan")
    x[(seed + 5) % 64, 3] = float("nan")
    return (x,)


def row_max(x):
    return torch.amax(x, -1)


def row_max_dropping_nan(x):                    # WRONG: an fmaxf-style max that skips NaN
    return torch.where(x.isnan(), torch.full_like(x, float("-inf")), x).amax(-1)


def test_nan_propagating_max(kernel_check):
    kernel_check(lambda x: x.max(-1).values, row_max, with_nans, nonfinite="match", label="max_values")


def test_nan_dropping_max(kernel_check):
    kernel_check(row_max_dropping_nan, row_max, with_nans, nonfinite="match")
'''


def test_declared_nonfinite_values_are_matched_element_for_element(pytester: pytest.Pytester) -> None:
    out = run_suite(pytester, KERNELS, passed=5, failed={
        "big_negative_mask": "mismatch", "mask_one_late": "mismatch", "mask_one_early": "nonfinite",
        "nan_for_inf": "mismatch", "masked_unwritten": "stale_output", "undeclared": "reference_nonfinite",
        "lse_zero_for_empty_rows": "mismatch", "row_max_dropping_nan": "mismatch"})
    flat = " ".join(out.split())
    assert "out is -1e+30 at index (0, 1) where the reference is -inf" in flat
    assert "out is nan at index (0, 1) where the reference is -inf" in flat
    assert "out is 0 at index (0, 0) where the reference is -inf" in flat          # the row with no key
    assert "where the reference is nan" in flat                                     # the dropped NaN
    assert "out has NaN/Inf where the reference is finite" in flat                  # -inf one early
    assert "declare them: nonfinite='match'" in flat                                # undeclared: named


def masked(x):
    return torch.log_softmax(x.masked_fill(torch.ones(64, 64, dtype=torch.bool).triu(1), float("-inf")), -1)


def square(seed):
    return (make_tensor((64, 64), "float32", seed=seed),)


def test_undeclared_nan_keeps_the_domain_advice() -> None:
    with pytest.raises(GateFailure) as failure:
        check_kernel(torch.log, torch.log, square)                  # log of negative inputs: NaN, not structure
    message = str(failure.value)
    assert failure.value.reason == "reference_nonfinite"
    assert "draw inputs inside the reference's domain" in message and "nonfinite='match'" not in message


def test_a_reference_non_finite_everywhere_fails_even_when_declared() -> None:
    def all_masked(x):
        return torch.full_like(x, float("-inf"))

    with pytest.raises(GateFailure) as failure:
        check_kernel(all_masked, all_masked, square, nonfinite="match")
    assert failure.value.reason == "reference_nonfinite"
    assert "nothing is left to compare" in str(failure.value)


def test_bounds_are_computed_over_the_finite_elements() -> None:
    report = check_kernel(masked, masked, square, nonfinite="match", trials=1, input_scales=())
    output = report.trials[0].outputs[0]
    assert output.numel == 64 * 65 // 2 and output.shape == (64, 64)
    finite = masked(square(0)[0].double())
    expected_mean = float(finite[torch.isfinite(finite)].abs().mean())
    assert output.scale == pytest.approx(expected_mean)              # not diluted by the 2016 masked elements


def test_a_scaled_candidate_fails_naming_its_worst_element_in_the_whole_output() -> None:
    with pytest.raises(GateFailure) as failure:
        check_kernel(lambda x: masked(x) * 1.001, masked, square, nonfinite="match", label="scaled")
    output = failure.value.report.trials[0].outputs[0]
    row, column = output.worst_index
    assert failure.value.reason == "mismatch" and column <= row      # an element below the mask's diagonal
    assert output.worst_reference == pytest.approx(float(masked(square(0)[0].double())[row, column]))


def test_an_extremal_trial_that_overflows_is_skipped_not_matched() -> None:
    def masked_exp(x):                                               # overflows at inputs x 1000
        return torch.exp(x.masked_fill(torch.ones(64, 64, dtype=torch.bool).triu(1), float("-inf")))

    for trials in (5, 1):                                            # with and without a unit trial of that seed
        report = check_kernel(masked_exp, masked_exp, square, nonfinite="match", trials=trials)
        skipped = [trial.scale for trial in report.extremal_trials if trial.skipped]
        assert 1000.0 in skipped and 0.001 not in skipped, report.notes
        assert any("non-finite elsewhere than on the same inputs at unit scale" in note for note in report.notes)


@pytest.mark.parametrize("value", ["yes", True, None, "MATCH"])
def test_nonfinite_takes_reject_or_match(value) -> None:
    with pytest.raises(DitgateUsageError, match="nonfinite must be 'reject'"):
        check_kernel(masked, masked, square, nonfinite=value)


def test_the_module_imports_no_torch() -> None:
    import subprocess
    import sys

    code = "import sys, pytest_ditgate.correctness.expected_nonfinite; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
