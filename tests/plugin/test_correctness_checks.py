"""check_kernel on CPU tensors: honest kernels pass over many seeds; layouts, structures, tolerances, options."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from pytest_ditgate import GateFailure, check_kernel, tolerance_for  # noqa: E402
from pytest_ditgate.correctness.inputs import make_tensor  # noqa: E402
from pytest_ditgate.errors import DitgateUsageError  # noqa: E402


def _inputs(dtype, *shapes):
    def make(seed):
        return tuple(make_tensor(shape, dtype, seed=seed * 31 + i) for i, shape in enumerate(shapes))
    return make


def _reason(excinfo) -> str:
    return excinfo.value.reason


# -- honest candidates: legitimate low-precision rounding passes, over >= 50 seeds ------------------

HONEST = {
    # computes each op in the low dtype: two roundings per element
    "fp16 fma in fp16": (torch.float16, lambda x, w, b: x * w + b, ((17, 24), (24,), (24,))),
    "bf16 fma in bf16": (torch.bfloat16, lambda x, w, b: x * w + b, ((17, 24), (24,), (24,))),
    "bf16 gelu": (torch.bfloat16, lambda x, w, b: torch.nn.functional.gelu(x) * w + b, ((9, 33), (33,), (33,))),
    "fp16 rmsnorm, fp32 accumulate": (
        torch.float16,
        lambda x, w, b: ((x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)) * w.float()
                         + b.float()).half(),
        ((7, 64), (64,), (64,))),
    "fp32 matmul": (torch.float32, lambda x, w, b: x @ w + b, ((5, 48), (48, 9), (9,))),
    "bf16 softmax": (torch.bfloat16, lambda x, w, b: torch.softmax(x.float() * 2, -1).to(x.dtype) + b,
                     ((6, 31), (31,), (31,))),
}


@pytest.mark.parametrize("name", list(HONEST))
def test_honest_low_precision_kernels_pass_over_50_seeds(name: str) -> None:
    dtype, kernel, shapes = HONEST[name]
    reference = kernel  # the same math, run by the gate on float64 copies

    report = check_kernel(kernel, reference, _inputs(dtype, *shapes), trials=50)
    assert report.passed and report.seeds == list(range(50))
    assert report.reference_dtype == "float64"
    assert report.rel_norm_error <= tolerance_for(dtype).rel_norm


# -- layouts: hypothesis-drawn shapes/dtypes/layouts ------------------------------------------------

def test_strategies_drive_the_gate_over_awkward_layouts() -> None:
    from hypothesis import HealthCheck, given, settings

    from pytest_ditgate.correctness.strategies import tensor_specs

    seen = set()

    @settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(spec=tensor_specs(dims=(1, 3), block=16, max_side=40))
    def check(spec) -> None:
        seen.add(spec.layout)
        check_kernel(lambda x: x * 2 - 1, lambda x: x * 2 - 1, lambda s: (spec.make(s),), trials=2)

    check()
    assert {"transposed", "strided"} <= seen


@pytest.mark.parametrize("layout", ["transposed", "strided", "offset"])
def test_a_kernel_that_assumes_contiguous_memory_fails_on_other_layouts(layout: str) -> None:
    def assumes_contiguous(x):  # reads the storage as if it were row-major from offset 0
        raw = torch.as_strided(x, x.shape, x.contiguous().stride(), 0)
        return raw * 2

    with pytest.raises(GateFailure) as excinfo:
        check_kernel(assumes_contiguous, lambda x: x * 2, lambda s: make_tensor((6, 10), seed=s, layout=layout))
    assert _reason(excinfo) == "mismatch"
    assert "strides" in excinfo.value.message or layout == "offset"


def test_strategy_sizes_reach_edges() -> None:
    from hypothesis import find

    from pytest_ditgate.correctness.strategies import shapes, sizes

    assert find(sizes(block=64), lambda s: s == 63) == 63
    assert find(sizes(block=64), lambda s: s == 65) == 65
    assert 1 in find(shapes(dims=3), lambda shape: 1 in shape)


# -- structures, dtypes, tolerances -----------------------------------------------------------------

def test_dict_outputs_name_the_offending_output() -> None:
    def reference(x):
        return {"max": x.amax(-1), "lse": torch.logsumexp(x, -1)}

    def kernel(x):
        return {"max": x.amax(-1), "lse": torch.logsumexp(x, -1) + 0.01}

    with pytest.raises(GateFailure) as excinfo:
        check_kernel(kernel, reference, _inputs(torch.float32, (4, 9)))
    assert _reason(excinfo) == "mismatch"
    assert "out['lse'] differs" in excinfo.value.message
    assert excinfo.value.report.failed_output == "out['lse']"


def test_tuple_output_structure_and_integer_outputs() -> None:
    reference = lambda x: (x.sort(-1).values, x.argsort(-1))  # noqa: E731
    make = lambda s: (make_tensor((3, 8), "float32", seed=s),)  # noqa: E731
    assert check_kernel(reference, reference, make).passed
    with pytest.raises(GateFailure) as excinfo:
        check_kernel(lambda x: (x.sort(-1).values,), reference, make)
    assert _reason(excinfo) == "shape" and "structured differently" in excinfo.value.message
    with pytest.raises(GateFailure) as excinfo:  # integers are exact: one index off fails
        check_kernel(lambda x: (x.sort(-1).values, x.argsort(-1).roll(1, -1)), reference, make)
    assert _reason(excinfo) == "mismatch" and "out[1]" in excinfo.value.message


def test_tolerance_table_is_at_least_as_strict_as_assert_close_rtol() -> None:
    assert tolerance_for(torch.float32).rtol <= 1.3e-6 and tolerance_for(torch.float32).atol <= 1e-5
    assert tolerance_for(torch.float64).rtol <= 1e-7
    assert tolerance_for(torch.float16).rtol <= 1e-3
    assert tolerance_for(torch.bfloat16).rtol <= 1.6e-2
    assert tolerance_for(torch.int32).exact and tolerance_for(torch.bool).exact
    assert tolerance_for(torch.float32, compute_dtype="tf32").rtol > tolerance_for(torch.float32).rtol
    assert tolerance_for(torch.float8_e4m3fn).rtol < tolerance_for(torch.float8_e5m2).rtol
    assert tolerance_for("fp16", atol=0.5).atol == 0.5
    with pytest.raises(DitgateUsageError, match="no tolerance for dtype 'quint8'"):
        tolerance_for("quint8")
    with pytest.raises(DitgateUsageError, match="rtol must be >= 0"):
        check_kernel(abs, abs, lambda s: torch.ones(1), rtol=-1)


def test_per_call_override_and_compute_dtype() -> None:
    kernel = lambda x: x * 1.004  # noqa: E731 - 0.4 % off: beyond the fp16 norm bound (2e-3)
    make = _inputs(torch.float16, (16, 16))
    with pytest.raises(GateFailure):
        check_kernel(kernel, lambda x: x, make)
    assert check_kernel(kernel, lambda x: x, make, rtol=6e-3, rel_norm=6e-3).passed
    tf32_like = lambda x: x * 1.001  # noqa: E731 - 0.1 % off: tf32 rounding, far beyond the fp32 bounds
    make32 = _inputs(torch.float32, (16, 16))
    with pytest.raises(GateFailure) as excinfo:
        check_kernel(tf32_like, lambda x: x, make32)
    assert _reason(excinfo) == "mismatch"
    assert check_kernel(tf32_like, lambda x: x, make32, compute_dtype="tf32").passed


@pytest.mark.parametrize("candidate, reference, what", [
    (lambda x: 0.0, lambda x: float(x.sum()), "non-tensor values out (float)"),
    (lambda x: (x * 2, 0), lambda x: (x * 2, int(x.argmax())), "non-tensor values out[1] (int)"),
    (lambda x: x * 2, lambda x: None, "no tensor"),
])
def test_outputs_the_gate_cannot_compare_are_a_usage_error(candidate, reference, what: str) -> None:
    """Non-tensor outputs are never compared, so a candidate returning any number would pass: refuse them."""
    with pytest.raises(DitgateUsageError, match=re.escape(f"reference returned {what}")):
        check_kernel(candidate, reference, _inputs(torch.float32, (4,)))
    assert check_kernel(lambda x: (x * 2, None), lambda x: (x * 2, None), _inputs(torch.float32, (4,))).passed


def test_reference_falls_back_to_float32_and_can_run_in_the_input_dtype() -> None:
    def reference(x):
        if x.dtype == torch.float64:
            raise RuntimeError("\"my_op\" not implemented for 'Double'")
        return x.float().exp().to(x.dtype)

    make = _inputs(torch.float16, (8,))
    report = check_kernel(lambda x: x.exp(), reference, make, trials=2)
    assert report.reference_dtype.startswith("float32 (float64 failed")
    same = check_kernel(lambda x: x.exp(), lambda x: x.exp(), make, reference_dtype="same", trials=2)
    assert same.reference_dtype == "same as inputs"
    with pytest.raises(DitgateUsageError):
        check_kernel(abs, abs, make, reference_dtype="float16")


def test_reference_that_mutates_its_input_is_reported_as_the_reference() -> None:
    with pytest.raises(GateFailure) as excinfo:
        check_kernel(lambda x: x * 2, lambda x: x.mul_(2), _inputs(torch.float32, (4,)))
    assert _reason(excinfo) == "input_mutated" and "the REFERENCE modified" in excinfo.value.message


def test_constant_function_with_constant_inputs_is_not_constant_output() -> None:
    make = lambda seed: (torch.linspace(0, 1, 7),)  # noqa: E731 - ignores the seed on purpose
    assert check_kernel(lambda x: x + 1, lambda x: x + 1, make).passed


# -- out= buffers -----------------------------------------------------------------------------------

def _out_inputs(seed):
    x = make_tensor((5, 6), "float32", seed=seed)
    return (x,), {"out": torch.zeros(5, 6)}


def test_out_buffers_are_poisoned_and_become_the_outputs() -> None:
    def kernel(x, *, out):
        torch.mul(x, 3, out=out)

    assert check_kernel(kernel, kernel, _out_inputs, out_args=("out",)).passed

    def lazy(x, *, out):
        out[:4] = x[:4] * 3  # never writes the last row: the poison shows

    with pytest.raises(GateFailure) as excinfo:
        check_kernel(lazy, kernel, _out_inputs, out_args=("out",))
    assert _reason(excinfo) == "stale_output"
    with pytest.raises(DitgateUsageError, match="out_args names 'dst'"):
        check_kernel(kernel, kernel, _out_inputs, out_args=("dst",))


# -- the report -------------------------------------------------------------------------------------

def test_report_is_json_ready_and_attached_to_the_failure() -> None:
    report = check_kernel(lambda x: x.sin(), lambda x: x.sin(), _inputs(torch.float32, (3, 5)), trials=3, seed=10)
    data = json.loads(json.dumps(report.to_dict()))
    assert data["seeds"] == [10, 11, 12] and data["passed"] is True
    assert data["trials"][0]["inputs"][0]["shape"] == [3, 5] and data["trials"][0]["determinism_checked"]
    assert "constant_output" in report.checks and "timer_tampered" in report.checks
    with pytest.raises(GateFailure) as excinfo:
        check_kernel(lambda x: x.cos(), lambda x: x.sin(), _inputs(torch.float32, (3, 5)), seed=4)
    failed = excinfo.value.report
    assert failed.passed is False and failed.reason == "mismatch" and failed.failed_trial == 0
    assert failed.trials[0].outputs[0].mismatches > 0 and "seed 4" in excinfo.value.message


# -- timer integrity --------------------------------------------------------------------------------

def test_tampered_timers_names_each_replaced_function(monkeypatch: pytest.MonkeyPatch) -> None:
    import functools
    import time
    import timeit

    from pytest_ditgate.timer_integrity import tampered_timers

    assert tampered_timers() == []
    monkeypatch.setattr(torch.cuda.Event, "elapsed_time", lambda self, end: 0.001)
    monkeypatch.setattr(time, "perf_counter_ns", functools.wraps(time.perf_counter_ns)(lambda: 0))
    monkeypatch.setattr(timeit, "default_timer", lambda: 0.0)
    assert tampered_timers() == ["time.perf_counter_ns", "timeit.default_timer", "torch.cuda.Event.elapsed_time"]
    monkeypatch.undo()

    class FakeEvent(torch.cuda.Event):
        pass

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    assert "torch.cuda.Event" in tampered_timers()


@pytest.mark.parametrize("run", ["same-precision", "|inputs|"])
def test_timers_replaced_in_an_estimate_run_fail_the_gate(monkeypatch: pytest.MonkeyPatch, run: str) -> None:
    """The honest-error estimate's two optional reference runs leave out a run that fails, but not one that
    replaced a timing function: that still fails the gate."""
    import time

    def reference(a, b):
        magnitude = bool((a >= 0).all() and (b >= 0).all())  # the |inputs| run (float32: a magnitude needs no more)
        same_precision = a.dtype == torch.float32 and not magnitude
        if (same_precision, magnitude) == (run == "same-precision", run == "|inputs|"):
            monkeypatch.setattr(time, "perf_counter", lambda: 0.0)
        return a @ b

    with pytest.raises(GateFailure) as failure:  # the table fails: the estimate's runs are made
        check_kernel(lambda a, b: (a @ b) * 1.01, reference, _inputs(torch.float32, (4, 8), (8, 4)), trials=1)
    assert _reason(failure) == "timer_tampered"


def test_timer_integrity_does_not_import_torch() -> None:
    code = ("import sys, pytest_ditgate.timer_integrity as t; assert t.tampered_timers() == []; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_timer_integrity_first_imported_under_a_patch_does_not_adopt_it() -> None:
    """Imported for the first time while a test patched perf_counter: the patch is caught, the restored clock is not."""
    code = (
        "import time\n"
        "real = time.perf_counter\n"
        "time.perf_counter = lambda: 0.0\n"
        "from pytest_ditgate.timer_integrity import tampered_timers\n"
        "assert tampered_timers() == ['time.perf_counter'], tampered_timers()\n"
        "time.perf_counter = real\n"
        "assert tampered_timers() == [], tampered_timers()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)


def test_a_compiled_candidate_is_checked_as_compiled_code() -> None:
    """The poisoning dispatch mode must not push a torch.compile'd candidate back to eager."""
    runs: list[int] = []

    def counting_backend(graph_module, example_inputs):  # noqa: ANN001 - dynamo's backend signature
        def run(*args):
            runs.append(1)
            return graph_module.forward(*args)
        return run

    def gelu_tanh(x):
        return torch.nn.functional.gelu(x, approximate="tanh")

    compiled = torch.compile(gelu_tanh, backend=counting_backend)

    def make_inputs(seed):
        return (torch.randn(64, 33, generator=torch.Generator().manual_seed(seed)),)

    check_kernel(compiled, gelu_tanh, make_inputs, trials=2)
    assert len(runs) >= 4, f"the compiled graph ran {len(runs)} times: the candidate was checked as eager code"


# -- bounds derived from the computation (issue 15) --------------------------------------------------

def test_a_long_sequential_dot_product_passes_and_a_0_1_percent_scaling_fails() -> None:
    """fp32, K=32768 summed in order: the honest error the table alone rejected elementwise now passes."""
    import numpy as np

    def sequential(a, b):
        products = (a[:, None, :] * b.t()[None, :, :]).numpy()
        return torch.from_numpy(np.add.accumulate(products, axis=-1)[..., -1].copy())

    make = _inputs(torch.float32, (3, 32768), (32768, 3))
    report = check_kernel(sequential, lambda a, b: a @ b, make, trials=5)
    assert report.passed
    with pytest.raises(GateFailure) as excinfo:
        check_kernel(lambda a, b: sequential(a, b) * 1.001, lambda a, b: a @ b, make)
    assert _reason(excinfo) == "mismatch" and "norm" in excinfo.value.report.trials[-1].outputs[0].failed_bounds


def test_failure_names_the_bound_the_estimate_and_the_ratio() -> None:
    with pytest.raises(GateFailure) as excinfo:
        check_kernel(lambda x: x.cumsum(-1) * 1.01, lambda x: x.cumsum(-1), _inputs(torch.float32, (4, 512)))
    message = excinfo.value.message
    assert "norm bound failed: rel-norm err" in message and "x its bound" in message
    assert "honest-error estimate: table 3.0e-05; same-precision run" in message and "u*|f(|x|)|/|f(x)|" in message
    assert "repro: check_kernel(" in message
    output = excinfo.value.report.trials[0].outputs[0]
    assert output.norm_ratio > 100 and output.honest.source in ("table", "same-precision", "magnitude")


def test_one_element_wrong_fails_the_elementwise_bound_only() -> None:
    def kernel(x):
        out = x.sum(-1)
        out[5] += 0.02  # 0.1 % of the row sums' size: 14 x its allowance, within the norm bound
        return out

    with pytest.raises(GateFailure) as excinfo:
        check_kernel(kernel, lambda x: x.sum(-1), _inputs(torch.float32, (16384, 64)))
    assert excinfo.value.report.trials[0].outputs[0].failed_bounds == ("elementwise",)
    assert "elementwise bound failed" in excinfo.value.message and "1 of 16384 elements mismatch" in excinfo.value.message


def test_an_exact_same_precision_run_leaves_room_for_another_summation_order() -> None:
    """Integer-valued inputs: torch's fp32 sum is exact; an honest kernel adding in another order still passes."""
    def make(seed):
        return (torch.randint(-8, 8, (8, 4096), generator=torch.Generator().manual_seed(seed)).float() / 3,)

    reverse = lambda x: x.flip(-1).cumsum(-1)[..., -1].contiguous()  # noqa: E731
    report = check_kernel(reverse, lambda x: x.sum(-1), make, trials=5)
    assert report.passed


def test_a_degenerate_same_precision_run_cannot_open_the_gate() -> None:
    """The reference overflows in fp16 (inf) or flushes to zero: that run is not used or is capped."""
    overflow = lambda x: (x * 1e4 * 1e4) * 1e-8  # noqa: E731 - inf in fp16, fine in float64
    with pytest.raises(GateFailure) as excinfo:
        check_kernel(lambda x: x * 1.05, overflow, _inputs(torch.float16, (8, 64)))
    output = excinfo.value.report.trials[0].outputs[0]
    assert output.honest.same_precision is None and "non-finite where the reference is finite" in str(output.honest)
    underflow = lambda x: (x * 1e-8) * 1e8  # noqa: E731 - zero in fp16: its "error" is the whole output
    with pytest.raises(GateFailure) as excinfo:
        check_kernel(lambda x: x * 1.05, underflow, _inputs(torch.float16, (8, 64)))
    output = excinfo.value.report.trials[0].outputs[0]
    assert output.honest.source == "ceiling" and output.rel_norm_bound == pytest.approx(4e-3)


def test_the_candidate_cannot_inflate_the_estimate_through_global_math_flags() -> None:
    """Flags the candidate sets (TF32, reduced-precision reductions) are overridden for the same-precision
    run and restored after it."""
    matmul = torch.backends.cuda.matmul
    saved = matmul.allow_tf32, matmul.allow_fp16_reduced_precision_reduction
    seen = []

    def reference(a, b):
        seen.append(matmul.allow_tf32)
        return a @ b

    def cheat(a, b):
        matmul.allow_tf32 = True
        return a @ b

    try:
        check_kernel(cheat, reference, _inputs(torch.float32, (4, 8), (8, 4)), trials=1, input_scales=())
        assert matmul.allow_tf32 is True  # restored to what the candidate left
        # float64 run, same-precision run (TF32 off), |inputs| run, the precision probe's float64 run
        assert seen == [True, False, True, True]
        seen.clear()
        check_kernel(cheat, reference, _inputs(torch.float32, (4, 8), (8, 4)), trials=1, compute_dtype="tf32")
        assert seen[1] is True
    finally:
        matmul.allow_tf32, matmul.allow_fp16_reduced_precision_reduction = saved


def test_reference_dtype_same_keeps_the_table() -> None:
    report = check_kernel(lambda x: x.sum(-1), lambda x: x.sum(-1), _inputs(torch.float32, (4, 64)),
                          reference_dtype="same", trials=1)
    assert report.trials[0].outputs[0].honest.source == "table"
    with pytest.raises(GateFailure) as failure:  # a failing output says why no estimate widened the bound
        check_kernel(lambda x: x.sum(-1) * 1.01, lambda x: x.sum(-1), _inputs(torch.float32, (4, 64)),
                     reference_dtype="same", trials=1)
    assert "table bounds only" in failure.value.message


def test_every_bound_reads_the_honest_rule_when_it_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """One source for the rule: a bound made directly, a table-only bound and an estimate all use the
    ``tolerances.HONEST_RULE`` of the moment (the docs table's producer swaps it for the old rule)."""
    from pytest_ditgate.correctness import honest, tolerances
    from pytest_ditgate.correctness.report import HonestBound

    rule = tolerances.HonestRule(same_precision=0.0, magnitude=0.0, length=0.0, elementwise=0.0)
    monkeypatch.setattr(tolerances, "HONEST_RULE", rule)
    reference = torch.ones(4, dtype=torch.float64)
    made = honest.estimate(reference, None, None, table=1e-5, roundoff=6e-8, ceiling=1e-3)
    assert HonestBound(table=1e-5).rule is HonestBound.table_only(1e-5).rule is made.rule is rule


def test_the_estimate_runs_only_where_the_table_fails() -> None:
    """Two extra reference runs on the first trial (its output dtypes) and on trials the table rejects."""
    calls: list[torch.dtype] = []

    def reference(a, b):
        calls.append(a.dtype)
        return a @ b

    check_kernel(lambda a, b: a @ b, reference, _inputs(torch.float32, (4, 8), (8, 4)), trials=3)
    # the first trial's three runs, one for each later trial, the precision probe's (on the last trial) and one
    # for each of the three extremal trials
    assert calls == [torch.float64, torch.float32, torch.float32] + [torch.float64] * 6
    calls.clear()
    with pytest.raises(GateFailure):
        check_kernel(lambda a, b: (a @ b) * 1.01, reference, _inputs(torch.float32, (4, 8), (8, 4)), trials=3)
    # float64, same precision, |inputs| (float32); the conditioning's four runs (only for an output that still
    # fails) and, the reference being a GEMM, four more with its sums' errors; the precision probe's run on the
    # failing trial
    assert calls == [torch.float64, torch.float32, torch.float32] + [torch.float64] * 8 + [torch.float64]


def test_the_same_precision_run_works_with_torchs_newer_precision_settings() -> None:
    """With ``fp32_precision`` in use, reading the legacy TF32 flags raises; the estimate must not be lost."""
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    saved = matmul.fp32_precision, conv.fp32_precision
    try:
        matmul.fp32_precision, conv.fp32_precision = "tf32", "ieee"
        with pytest.raises(GateFailure) as failure:  # a table failure makes the estimate's runs
            check_kernel(lambda a, b: (a @ b) * 1.01, lambda a, b: a @ b, _inputs(torch.float32, (4, 64), (64, 4)),
                         trials=1)
        assert failure.value.report.trials[0].outputs[0].honest.same_precision is not None
        assert (matmul.fp32_precision, conv.fp32_precision) == ("tf32", "ieee")
    finally:
        matmul.fp32_precision, conv.fp32_precision = saved


def test_a_contractions_sum_error_joins_each_elements_conditioning() -> None:
    """Products that cancel: one rounding of ``a @ b`` moves it by u * |a @ b| (tiny), the sum of its terms errs
    by u * (|a| @ |b|) (about 2e6 u here). The elementwise conditioning takes the larger; the norm's keeps one
    rounding per result."""
    from pytest_ditgate.correctness import conditioning

    a = torch.tensor([[1e6, -1e6], [3.0, 4.0]], dtype=torch.float64)
    b = torch.tensor([[1.0], [1.0 + 1e-9]], dtype=torch.float64)
    ref = a @ b

    def run(mode):  # the inputs unperturbed: only the product's own rounding and its sum's error move it
        with mode:
            return [("out", a @ b)]

    roundoff = 2.0 ** -24
    measured = conditioning.measure(run, {"out": ref}, roundoff=roundoff, seed=0)
    assert float(measured.elementwise["out"][0, 0]) > 0.1 * roundoff * 2e6  # the terms' size (one rounding: 5e-11)
    assert float(measured.elementwise["out"][1, 0]) < 50 * roundoff * 7  # no cancellation: about one rounding
    one_rounding = conditioning._runs(run, {"out": ref}, roundoff=roundoff, seed=0, runs=4, contractions=False)[0]
    assert measured.relative == one_rounding.relative
