"""The precision probe: a kernel that reads its inputs at a lower precision fails ``precision_downgrade``.

A pytest run (``pytester``) of planted downgrades (bf16-, fp16-rounded inputs and TF32 math in fp32 kernels, an
fp8 read of bf16 inputs, a float64 kernel computing in float32, one output of two downgraded) and of honest
kernels at realistic sizes; then the probe's parts one by one: the cells per dtype and declaration, the moves,
the decision and its false-alarm bound, the device libraries' switches, and the plugin's import staying
torch-free.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from pytest_ditgate import GateFailure, check_kernel  # noqa: E402
from pytest_ditgate.correctness import perturb, resolution, sensitivity, switches  # noqa: E402
from pytest_ditgate.correctness.inputs import make_tensor  # noqa: E402

SUITE = '''
import pytest
import torch
from pytest_ditgate.correctness.inputs import make_tensor


def tf32(t):
    bits = t.float().contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def positives(seed):                            # row sums of positives: bf16 rounding averages away
    return (make_tensor((32, 32768), "float32", seed=seed).abs(),)


def row_sums(x):
    return x.sum(-1)


def gemm_inputs(seed):
    return make_tensor((64, 512), "float32", seed=seed), make_tensor((512, 64), "float32", seed=seed + 100)


def gemm(a, b):
    return a @ b


def test_bf16_inputs(kernel_check):
    kernel_check(lambda x: row_sums(x.bfloat16().float()), row_sums, positives, label="bf16 inputs")


def test_fp16_inputs(kernel_check):
    kernel_check(lambda a, b: a.half().float() @ b.half().float(), gemm, gemm_inputs, label="fp16 inputs")


def test_tf32_math(kernel_check):
    kernel_check(lambda a, b: tf32(a) @ tf32(b), gemm, gemm_inputs, label="tf32 math")


def test_bf16_kernel_reading_fp8(kernel_check):
    inputs = lambda seed: (make_tensor((64, 1024), "bfloat16", seed=seed),)
    kernel_check(lambda x: torch.softmax(x.to(torch.float8_e4m3fn).float(), -1).to(x.dtype),
                 lambda x: torch.softmax(x, -1), inputs, label="fp8 reads")


def test_float64_kernel_in_float32(kernel_check):
    inputs = lambda seed: (make_tensor((32, 256), "float64", seed=seed),)
    kernel_check(lambda x: torch.tanh(x.float()).double(), torch.tanh, inputs, label="fp32 math")


def test_one_output_of_two(kernel_check):
    def kernel(x):
        return {"sum": x.sum(-1), "max": x.bfloat16().float().amax(-1)}
    kernel_check(kernel, lambda x: {"sum": x.sum(-1), "max": x.amax(-1)}, positives, label="two outputs")


def test_bf16_inputs_declared_tf32(kernel_check):
    kernel_check(lambda x: row_sums(x.bfloat16().float()), row_sums, positives, compute_dtype="tf32")


def test_honest_gemm_k4096(kernel_check):
    inputs = lambda seed: (make_tensor((256, 4096), "float32", seed=seed),
                           make_tensor((4096, 256), "float32", seed=seed + 100))
    report = kernel_check(gemm, gemm, inputs, trials=2)
    assert report.precision.status == "responds", report.precision.summary()
    out = report.precision.outputs[0]
    assert out.would_change > 60000 and out.unchanged < 100 and out.gain == pytest.approx(1, abs=0.01)
    print("HONEST", report.precision.summary())


def test_honest_kernels_respond(kernel_check):
    for candidate, reference, inputs in (
            (lambda x: row_sums(x.double()).float(), row_sums, positives),
            (lambda x: torch.softmax(x.float(), -1).to(x.dtype), lambda x: torch.softmax(x, -1),
             lambda seed: (make_tensor((64, 1024), "bfloat16", seed=seed),)),
            (lambda x: x.amax(-1), lambda x: x.amax(-1), positives)):
        report = kernel_check(candidate, reference, inputs)
        assert report.precision.status == "responds", report.precision.summary()


def test_tf32_declared(kernel_check):
    report = kernel_check(lambda a, b: tf32(a) @ tf32(b), gemm, gemm_inputs, compute_dtype="tf32")
    assert report.precision.status == "responds"
    assert "bfloat16's 7-bit cells (compute_dtype='tf32')" in report.precision.cells[0]


def test_bf16_declared(kernel_check):
    report = kernel_check(lambda x: row_sums(x.bfloat16().float()), row_sums, positives, compute_dtype="bfloat16")
    assert report.precision.status == "responds" and "float8's 3-bit" in report.precision.cells[0]


def test_probe_off(kernel_check):
    report = kernel_check(lambda x: row_sums(x.bfloat16().float()), row_sums, positives, check_precision=False)
    assert report.precision.status == "off" and "precision probe off (check_precision=False)" in report.summary()


def test_out_of_scope(kernel_check):
    argmax = kernel_check(lambda x: x.argmax(-1), lambda x: x.argmax(-1), positives)
    floor = kernel_check(torch.floor, torch.floor, lambda seed: (make_tensor((64, 64), "float32", seed=seed) * 50,))
    ints = kernel_check(lambda i: i * 2, lambda i: i * 2, lambda seed: (torch.arange(seed, seed + 64),))
    for report in (argmax, floor, ints):
        print("OUT_OF_SCOPE", report.precision.summary())
        assert report.precision.status == "out_of_scope"


def test_inconclusive(kernel_check):
    scalar = kernel_check(lambda x: x.bfloat16().float().sum(), lambda x: x.sum(),
                          lambda seed: (make_tensor((64, 256), "float32", seed=seed).abs(),), input_scales=())
    same = kernel_check(row_sums, row_sums, positives, reference_dtype="same")
    for report in (scalar, same):
        print("INCONCLUSIVE", report.precision.summary())
        assert report.precision.status == "inconclusive"
'''

DOWNGRADES = {
    "test_bf16_inputs": ("bf16 inputs", "out", "tf32/float16's 10-bit"),
    "test_fp16_inputs": ("fp16 inputs", "out", "tf32/float16's 10-bit"),
    "test_tf32_math": ("tf32 math", "out", "tf32/float16's 10-bit"),
    "test_bf16_kernel_reading_fp8": ("fp8 reads", "out", "float8's 3-bit"),
    "test_float64_kernel_in_float32": ("fp32 math", "out", "float32's 23-bit"),
    "test_one_output_of_two": ("two outputs", "out['max']", "tf32/float16's 10-bit"),
    "test_bf16_inputs_declared_tf32": ("test_bf16_inputs_declared_tf32.<locals>.<lambda>", "out", "bfloat16's 7-bit"),
}


PASSING = ("test_honest_gemm_k4096", "test_honest_kernels_respond", "test_tf32_declared", "test_bf16_declared",
           "test_probe_off", "test_out_of_scope", "test_inconclusive")


def test_downgrades_fail_naming_the_output_and_honest_kernels_pass(pytester: pytest.Pytester) -> None:
    """Each downgrade fails ``precision_downgrade`` with the output and the grid in its headline; honest kernels
    (a 256 x 4096 @ 4096 x 256 fp32 GEMM among them) pass, and what the probe cannot judge is reported."""
    pytester.makepyfile(test_probe_suite=SUITE)
    result = pytester.runpytest("--ditgate", "-p", "no:randomly", "-s")
    result.assert_outcomes(passed=len(PASSING), failed=len(DOWNGRADES))
    calls = {r.nodeid.split("::")[-1]: r for r in result.reprec.getreports("pytest_runtest_logreport")
             if r.when == "call"}
    for test, (label, output, grid) in DOWNGRADES.items():
        text = str(calls[test].longrepr)
        assert calls[test].failed and "GateFailure: [precision_downgrade]" in text, (test, text[-2500:])
        assert (f"kernel_check {label!r} failed: precision_downgrade: {output} stays exactly the same when every "
                f"floating input moves within its cells of {grid}") in text, (test, text[-2500:])
        assert f"output {output}: precision_downgrade (unchanged on" in text, (test, text[-2500:])
        assert "compute_dtype='tf32', 'float16' or 'bfloat16'" in text and "repro: check_kernel(" in text
    assert all(calls[test].passed for test in PASSING)
    out = result.stdout.str()
    assert "HONEST precision probe responds (trial 2, seed 1; 2 extra calls): out: responds (unchanged on" in out
    assert "an output of int64 (an index, a count or a mask) is exact" in out
    assert "piecewise constant: the reference's output did not move at all" in out
    assert "no floating input to move" in out
    assert "with so few elements (the probe decides at 0.0001)" in out  # a scalar sum: one element
    assert "reference_dtype='same'" in out


# -- the cells: which grid each dtype and declaration is moved within ----------------------------------

@pytest.mark.parametrize(("dtype", "declared", "bits"), [
    ("float32", None, 10), ("float16", None, 7), ("bfloat16", None, 3), ("float64", None, 23),
    ("float32", "tf32", 7), ("float32", "float16", 7), ("float32", "bfloat16", 3), ("bfloat16", "tf32", 3),
    ("float32", "float8_e4m3fn", None), ("float8_e4m3fn", None, None), ("int64", None, None),
])
def test_cells_follow_the_claim(dtype: str, declared: str | None, bits: int | None) -> None:
    assert resolution.cell_bits(dtype, declared) == bits


def test_the_plan_says_why_an_input_stays() -> None:
    cells = resolution.plan([("arg0", "float32"), ("out", "float32"), ("arg2", "int64")], "bf16", fixed=("out",))
    assert [c.bits for c in cells] == [3, None, None]
    assert "compute_dtype='bfloat16'" in str(cells[0]) and "output buffer" in str(cells[1])


# -- the moves ---------------------------------------------------------------------------------------

def _tf32(t):
    bits = t.float().contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def test_a_float32_move_is_invisible_at_tf32_fp16_bf16_and_fp8_and_about_1850_ulps() -> None:
    x = torch.randn(100_000, generator=torch.Generator().manual_seed(0)) * torch.logspace(-20, 20, 100_000)
    moved = perturb.within_cells(x, 10)
    assert torch.equal(_tf32(moved), _tf32(x)) and torch.equal(moved.half(), x.half())
    assert torch.equal(moved.bfloat16(), x.bfloat16())
    # past fp8's range a cast is NaN or saturates, as the torch version has it: the same either way
    fp8, fp8_x = moved.to(torch.float8_e4m3fn).float(), x.to(torch.float8_e4m3fn).float()
    assert torch.equal(fp8.isnan(), fp8_x.isnan()) and torch.equal(fp8[~fp8.isnan()], fp8_x[~fp8_x.isnan()])
    ulps = (moved.view(torch.int32).long() - x.view(torch.int32).long()).abs().float().mean()
    assert 1750 < float(ulps) < 1950 and float((moved != x).float().mean()) > 0.99


def test_bf16_and_fp16_moves_are_invisible_at_fp8_and_bf16() -> None:
    x = make_tensor((50_000,), "bfloat16", seed=1)
    moved = perturb.within_cells(x, 3)
    assert torch.equal(moved.to(torch.float8_e4m3fn).float()[x.abs() > 2 ** -6],
                       x.to(torch.float8_e4m3fn).float()[x.abs() > 2 ** -6])  # fp8's normal range
    assert 0.01 < float(((moved.float() - x.float()) / x.float()).abs().mean()) < 0.03
    h = make_tensor((50_000,), "float16", seed=2)
    normal = h.abs() >= 2 ** -14  # fp16's subnormals are spaced evenly, bf16's values there are not
    assert torch.equal(perturb.within_cells(h, 7).bfloat16()[normal], h.bfloat16()[normal])


def test_moves_keep_layout_specials_and_exact_grid_points() -> None:
    x = make_tensor((64, 48), "float32", seed=3).t()
    x[0, :4] = torch.tensor([0.0, float("inf"), float("nan"), 1.0])
    moved = perturb.within_cells(x, 10)
    assert moved.stride() == x.stride() and moved.dtype == x.dtype
    assert moved[0, 0] == 0 and moved[0, 1] == float("inf") and moved[0, 2].isnan() and moved[0, 3] == 1.0
    z = torch.randn(256, dtype=torch.complex64)
    assert torch.equal(_tf32(torch.view_as_real(perturb.within_cells(z, 10))), _tf32(torch.view_as_real(z)))


# -- the decision ------------------------------------------------------------------------------------

def test_the_chernoff_bound() -> None:
    assert sensitivity.chernoff(0, 0.1) == 1.0 and sensitivity.chernoff(10, 0.6) == 1.0
    # P(Binomial(40, 0.05) >= 20) is about 1e-16; the bound holds above it and below 1e-4
    assert 1e-16 < sensitivity.chernoff(40, 0.05) < 1e-4
    assert sensitivity.chernoff(4, 1 / 3) > sensitivity.FALSE_ALARM  # four elements near 4 spacings: undecided


def test_an_honest_kernels_false_alarm_rate_stays_under_its_bound() -> None:
    """1000 honest outputs whose reference moves by 4 to 40 spacings and whose noise is as wide as that move
    (the worst case for the bound): none fails, and their unchanged elements stay within the mean bound."""
    g = torch.Generator().manual_seed(0)
    failed, stayed, expected = 0, 0, 0.0
    for _ in range(1000):
        q = 2.0 ** -23
        ref = 1 + torch.rand(32, generator=g, dtype=torch.float64) * 0.5
        move = (4 + 36 * torch.rand(32, generator=g, dtype=torch.float64)) * q
        noise = lambda: torch.randn(32, generator=g, dtype=torch.float64) * move  # noqa: E731
        before, after = (ref + noise()).float(), (ref + move + noise()).float()
        verdict = sensitivity.judge("out", before, after, ref, ref + move, scaled_error=1.0)
        failed += verdict.status == "precision_downgrade"
        stayed += verdict.unchanged
        expected += verdict.honest_stay * verdict.would_change
    assert failed == 0 and stayed <= expected


def test_the_gain_is_reported_not_decisive() -> None:
    ref = torch.linspace(1, 2, 4096, dtype=torch.float64)
    move = torch.full_like(ref, 2e-5)
    half = sensitivity.judge("out", ref.float(), (ref + move / 2).float(), ref, ref + move, scaled_error=0.0)
    assert half.status == "responds" and half.gain == pytest.approx(0.5, abs=0.01)


# -- the device libraries' switches ----------------------------------------------------------------

def test_a_switch_is_covered_by_the_declared_precision_or_a_coarser_one() -> None:
    tf32, bf16 = switches.SWITCHES[0][0], switches.SWITCHES[3][0]
    assert not switches.covered(tf32, None) and switches.covered(tf32, "tf32") and switches.covered(tf32, "bf16")
    assert not switches.covered(bf16, "tf32") and switches.covered(bf16, "bfloat16")


def _bf16_pair(m: int, k: int):
    """make_inputs of a bf16 GEMM: ``(m, k) @ (k, m)``."""
    return lambda seed: (make_tensor((m, k), "bfloat16", seed=seed), make_tensor((k, m), "bfloat16", seed=seed + 1))


def test_switches_are_recorded_and_change_nothing_on_a_cpu() -> None:
    matmul = torch.backends.cuda.matmul
    saved = matmul.allow_bf16_reduced_precision_reduction
    matmul.allow_bf16_reduced_precision_reduction = True
    try:
        report = check_kernel(lambda a, b: a @ b, lambda a, b: a @ b, _bf16_pair(16, 64), trials=1)
    finally:
        matmul.allow_bf16_reduced_precision_reduction = saved
    line = next(s for s in report.precision.switches if "bf16_reduced" in s)
    assert "=on: no effect here (it changes only CUDA GEMMs and convolutions of bfloat16)" in line
    assert "change nothing on a CPU" in report.precision.summary()


@pytest.fixture
def as_if_on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The switches' library device taken to be this CPU: the forced-off run is what a CUDA check makes."""
    monkeypatch.setattr(switches, "library_device", lambda tensor: True)


def _reduces_in_bf16(a, b):
    """A bf16 GEMM that, with torch's switch on, adds its K halves in bf16 (what cuBLAS may do)."""
    if torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction:
        half = a.shape[1] // 2
        return ((a[:, :half] @ b[:half]) + (a[:, half:] @ b[half:])).bfloat16()
    return (a.float() @ b.float()).bfloat16()


def test_a_reduction_in_bf16_under_the_switch_fails_unless_declared(as_if_on_a_gpu) -> None:
    matmul = torch.backends.cuda.matmul
    saved = matmul.allow_bf16_reduced_precision_reduction
    inputs = _bf16_pair(32, 256)
    matmul.allow_bf16_reduced_precision_reduction = True
    try:
        with pytest.raises(GateFailure) as failure:
            check_kernel(_reduces_in_bf16, lambda a, b: a @ b, inputs, trials=1, input_scales=())
        declared = check_kernel(_reduces_in_bf16, lambda a, b: a @ b, inputs, trials=1, input_scales=(),
                                compute_dtype="bfloat16")
        matmul.allow_bf16_reduced_precision_reduction = False
        honest = check_kernel(_reduces_in_bf16, lambda a, b: a @ b, inputs, trials=1, input_scales=())
    finally:
        matmul.allow_bf16_reduced_precision_reduction = saved
    assert failure.value.reason == "precision_downgrade"
    precision = failure.value.report.precision  # its outputs respond to the moves: the switch is what fails it
    assert precision.status == "precision_downgrade" and precision.outputs[0].status == "responds"
    message = failure.value.message
    assert "out changes on" in message and "with cuda.matmul.allow_bf16_reduced_precision_reduction off" in message
    assert "declared by compute_dtype='bfloat16'" in " ".join(declared.precision.switches)
    assert honest.precision.status == "responds"


# -- the plugin stays torch-free -----------------------------------------------------------------------

def test_importing_the_plugin_and_the_probes_report_imports_no_torch() -> None:
    code = ("import sys, pytest_ditgate.plugin, pytest_ditgate.correctness.report, "
            "pytest_ditgate.correctness.precision_probe, pytest_ditgate.verdict.outcome; "
            "print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "False", result.stdout + result.stderr


def test_the_reason_is_a_quality_failure_of_the_verdict() -> None:
    from pytest_ditgate.correctness.report import REASONS
    from pytest_ditgate.verdict.outcome import REASON_CATEGORIES, Category

    assert "precision_downgrade" in REASONS and REASON_CATEGORIES["precision_downgrade"] is Category.QUALITY


def test_figures_are_finite_or_absent() -> None:
    ref = torch.linspace(1, 2, 64, dtype=torch.float64)
    verdict = sensitivity.judge("out", ref.float(), ref.float(), ref, ref * (1 + 1e-3), scaled_error=1e-3)
    assert verdict.status == "precision_downgrade" and verdict.gain == 0
    assert all(v is None or math.isfinite(v) for v in (verdict.honest_stay, verdict.false_alarm, verdict.gain))


def test_a_compiled_candidate_is_forced_off_without_a_dispatch_mode(as_if_on_a_gpu, monkeypatch) -> None:
    """A compiled candidate gets the switches set off around its call, no dispatch mode (which would run it
    eagerly): its effect is measured all the same."""
    from pytest_ditgate.correctness import poison

    monkeypatch.setattr(poison, "looks_compiled", lambda candidate: candidate is _reduces_in_bf16)
    matmul = torch.backends.cuda.matmul
    saved = matmul.allow_bf16_reduced_precision_reduction
    matmul.allow_bf16_reduced_precision_reduction = True
    try:
        with pytest.raises(GateFailure) as failure:
            check_kernel(_reduces_in_bf16, lambda a, b: a @ b, _bf16_pair(32, 256), trials=1, input_scales=())
    finally:
        matmul.allow_bf16_reduced_precision_reduction = saved
    assert failure.value.reason == "precision_downgrade" and "allow_bf16_reduced_precision_reduction off" in \
        failure.value.message
    assert not isinstance(switches.forced_off(dispatch=False), torch.utils._python_dispatch.TorchDispatchMode)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_an_output_of_zeros_or_noise_is_wrong_not_downgraded(dtype) -> None:
    """The probe finds such an output unmoved by the input moves, but its error is the output's whole size:
    it fails ``mismatch`` (a downgrade to any grid the probe tests errs by a few percent at most)."""
    inputs = lambda seed: (make_tensor((64, 128), dtype, seed=seed),)  # noqa: E731
    for wrong in (torch.zeros_like, lambda x: torch.ones_like(x) * 3):
        with pytest.raises(GateFailure) as failure:
            check_kernel(wrong, lambda x: x * 2, inputs, trials=1)
        assert failure.value.reason == "mismatch", failure.value.message
    with pytest.raises(GateFailure) as failure:  # a real downgrade still says so
        check_kernel(lambda x: x.bfloat16().float() * 2, lambda x: x * 2, lambda s: (make_tensor((64, 128), "float32",
                                                                                                  seed=s),), trials=1)
    assert failure.value.reason == "precision_downgrade"


def test_an_output_that_cancels_is_judged_at_its_own_rounding_noise() -> None:
    """``(1 + x) - 1`` at x ~ 1e-4 in float32: the float64 reference moves by thousands of spacings of the tiny
    result, but any fp32 kernel's result is as coarse as its rounding of ``1 + x`` (1.2e-7), so about half of its
    elements stay: the probe counts a move in units of the element's simulated rounding error there, so an
    honest kernel is not called downgraded."""
    def cancel(x):
        return (1 + x) - 1

    report = check_kernel(cancel, cancel, lambda seed: (make_tensor((256,), "float32", seed=seed) * 1e-4,),
                          trials=3, input_scales=())
    assert report.precision.status == "inconclusive", report.precision.summary()
    assert "own rounding noise" in report.precision.summary()
