"""The tolerance corpus on CUDA: the same ops, honest and wrong variants as the CPU corpus
(``tests/plugin/test_tolerance_corpus.py``) at its sizes, then cuBLAS/cuDNN/SDPA, float64-then-cast,
non-contiguous and (fp32) ``torch.compile`` variants at heavier sizes. TF32 and fp16/bf16 reduced-precision
GEMM reductions are off except in the tests of those switches: each switch, turned on by the candidate around
its call, fails ``precision_downgrade`` on every GEMM and convolution of the corpus where it changes the result
(unless ``compute_dtype`` declares it), and torch's default switches (cuDNN's TF32 on) fail an fp32 convolution
that does not declare TF32 wherever cuDNN's algorithm uses it. The precision probe runs in every check; the
downgrade variants (bf16-, fp16-rounded inputs, TF32 math emulated) fail as ``precision_downgrade`` here too.
Run with ``pytest --ditgate tests/gates/test_tolerance_corpus_gpu.py -v -rs``. ``DITGATE_CORPUS_SHARD=i/n``
keeps every n-th case from the i-th (0-based) of each test, and the unparametrized test in shard 0 only (not
collected elsewhere), so that n processes share the work
(scripts/gpu_check.py runs the corpus as parallel shards on one GPU: these tests time nothing).

torch's own CUDA cumsum (fp16, bf16) and cumprod (fp16, bf16) accumulate in the low precision (pytorch#180150,
#180155; measured on an H200: bf16 cumsum and the cumprods 1.9e-2, 0.64 and 0.74 at 2 x 32768, against 1.7e-3,
2.1e-4 and 1.6e-3 for the same scan in fp32 then cast; on an H100 the fp16 cumsum 4.6e-3 on rows scaled by
10^U(-3, 3), 1.15 x fp16's ceiling). They are not honest variants there, and the gate rejects them even with
``compute_dtype`` declared: ``test_torchs_low_precision_cuda_scans_are_rejected``.

Every check runs the default extremal trials (inputs x 1e-3, x 1e3, mixed rows) after its 10 seeds. The LLM
part of the corpus (``tests/plugin/test_tolerance_corpus_llm.py``: in-place and scratch kernels, RMSNorm's
backward at a normalised dimension of 1 and on a single row, a cross-entropy gradient of 512 x 128256 whose
bf16 elements are all below 3e-4, eps and overflow at extremal scales) runs here at LLM sizes.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.requires_gpu(why="the tolerance corpus on CUDA tensors")

corpus = pytest.importorskip("tests.plugin.test_tolerance_corpus")
llm = pytest.importorskip("tests.plugin.test_tolerance_corpus_llm")


def _shard() -> tuple[int, int]:
    """(index, count) from DITGATE_CORPUS_SHARD=i/n; (0, 1) when unset."""
    import os

    text = os.environ.get("DITGATE_CORPUS_SHARD", "")
    if not text:
        return 0, 1
    index, count = (int(part) for part in text.split("/"))
    if not 0 <= index < count:
        raise ValueError(f"DITGATE_CORPUS_SHARD={text!r}: want i/n with 0 <= i < n")
    return index, count


def _mine(cases: list) -> list:
    index, count = _shard()
    return cases[index::count]


def _gpu_cases() -> list:
    return _mine([(op, dtype) for op in corpus.OPS for dtype in op.gpu_dtypes])


@pytest.fixture(autouse=True)
def _no_tf32():
    """Honest fp32 candidates must not run on TF32 tensor cores unless they declare it."""
    import torch

    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = (matmul.allow_tf32, cudnn.allow_tf32, matmul.allow_fp16_reduced_precision_reduction,
             matmul.allow_bf16_reduced_precision_reduction)
    matmul.allow_tf32 = cudnn.allow_tf32 = False
    matmul.allow_fp16_reduced_precision_reduction = matmul.allow_bf16_reduced_precision_reduction = False
    yield
    (matmul.allow_tf32, cudnn.allow_tf32, matmul.allow_fp16_reduced_precision_reduction,
     matmul.allow_bf16_reduced_precision_reduction) = saved


def _compiled(op):
    import torch

    return torch.compile(op.reference, dynamic=False)


@pytest.mark.parametrize("case", _gpu_cases(), ids=corpus._id)
def test_honest_variants_pass_ten_seeds_on_cuda(case) -> None:
    """Every honest variant of the CPU corpus (sequential orders included) at the CPU corpus's sizes."""
    corpus.check_honest(*case, "cuda")


@pytest.mark.parametrize("case", _gpu_cases(), ids=corpus._id)
def test_honest_library_and_compiled_kernels_pass_ten_seeds_at_gpu_sizes(case) -> None:
    """cuBLAS/cuDNN/SDPA, float64-then-cast, non-contiguous and (fp32) torch.compile at the heavy sizes."""
    import functools

    op, dtype = case
    make = op.make_inputs(dtype, "cuda", gpu=True)
    variants = {name: kernel for name, kernel in corpus.honest_variants(op, dtype, "cuda").items()
                if name in ("torch", "float64-then-cast", "non-contiguous", "fp32 math")}
    if dtype == "float32":
        variants["compiled"] = _compiled(op)
    check = functools.partial(corpus.check_kernel, trials=corpus.SEEDS, **corpus.HONEST_OPTIONS)
    for name, kernel in variants.items():
        unit_scale = ({"input_scales": ()} if dtype in op.extremal_unsafe and name in corpus.LOW_PRECISION_MATH
                      else corpus._scales(op))  # low-precision math that under- or overflows there, as on the CPU
        report = check(kernel, op.reference, make, label=f"{op.name} {dtype} {name} (GPU sizes)", **unit_scale)
        print(f"\n{report.summary()}")
        assert report.precision.status in ("responds", "out_of_scope", "inconclusive"), report.precision.summary()


@pytest.mark.parametrize("case", _gpu_cases(), ids=corpus._id)
def test_wrong_variants_fail_on_cuda(case) -> None:
    corpus.check_wrong(*case, "cuda")


def test_tf32_tensor_cores_pass_only_where_declared() -> None:
    import torch

    from pytest_ditgate import GateFailure, check_kernel

    op = corpus.OPS[0]
    make = op.make_inputs("float32", "cuda", gpu=True)

    def tf32_matmul(a, b):
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            return a @ b
        finally:
            torch.backends.cuda.matmul.allow_tf32 = False

    assert check_kernel(tf32_matmul, op.reference, make, trials=corpus.SEEDS, compute_dtype="tf32").passed
    with pytest.raises(GateFailure) as failure:
        check_kernel(tf32_matmul, op.reference, make, trials=corpus.SEEDS)
    assert failure.value.reason == "precision_downgrade"


def _switch_cases() -> list:
    return _mine([(op, dtype, switch) for op in corpus.OPS for switch, (dtype, kind, _) in corpus.SWITCHES.items()
                  if op.library == kind and dtype in op.gpu_dtypes])


def _switch_id(case) -> str:
    op, dtype, switch = case
    return f"{op.name} {dtype} {switch.rsplit('.', 1)[-1]}"


@pytest.mark.parametrize("case", _switch_cases(), ids=_switch_id)
def test_each_switch_fails_where_it_changes_the_result_and_passes_declared(case) -> None:
    """At the GPU sizes: the op under the switch fails where the switch changes its output (``precision_downgrade``,
    or ``mismatch`` where the bound sees the error first: TF32 on a 4096 x 1152 x 1152 linear errs by 10 x fp32's
    bound); with no effect it passes, and the report says so; declared, it passes; the op without it passes."""
    from pytest_ditgate import GateFailure, check_kernel

    op, dtype, switch = case
    make = op.make_inputs(dtype, "cuda", gpu=True)
    options = dict(trials=corpus.SEEDS, **corpus.HONEST_OPTIONS, **corpus._scales(op))
    changes = corpus.changes_the_result(switch, op, make)
    print(f"\n{_switch_id(case)}: the switch changes the result: {changes}")
    if changes:
        with pytest.raises(GateFailure) as failure:
            check_kernel(corpus.under(switch, op.reference), op.reference, make, label=_switch_id(case), **options)
        assert failure.value.reason in ("precision_downgrade", "mismatch"), failure.value.message
        print(failure.value.message.splitlines()[0])
    else:
        report = check_kernel(corpus.under(switch, op.reference), op.reference, make, **options)
        print(report.precision.summary())
    declared = corpus.SWITCHES[switch][2]
    report = check_kernel(corpus.under(switch, op.reference), op.reference, make, compute_dtype=declared, **options)
    assert report.precision.status in ("responds", "inconclusive", "out_of_scope"), report.precision.summary()
    assert check_kernel(op.reference, op.reference, make, **options).precision.status != "precision_downgrade"


@pytest.mark.requires_gpu(tf32=True, why="cuDNN's TF32 convolutions")
def test_torchs_default_switches_fail_an_undeclared_fp32_convolution() -> None:
    """cuDNN's TF32 is on by default: an fp32 convolution run with torch's defaults fails unless declared, where
    cuDNN's choice of algorithm uses it (on an H100 with torch 2.11 it does at this size: the switch changes all
    but 0.01 % of the outputs). Where it chooses none that does, the check passes and its report says so."""
    from pytest_ditgate import GateFailure, check_kernel

    op = next(op for op in corpus.OPS if op.name == "conv2d")
    make = op.make_inputs("float32", "cuda", gpu=True)
    before = corpus.set_switch("torch.backends.cudnn.allow_tf32", True)  # torch's default (the fixture turned it off)
    try:
        if not corpus.changes_the_result("torch.backends.cudnn.allow_tf32", op, make):
            report = check_kernel(op.reference, op.reference, make, trials=2, label="conv2d with torch's defaults")
            line = next(s for s in report.precision.switches if "cudnn.allow_tf32" in s)
            assert "=on: no effect on the outputs" in line, report.precision.switches
            return
        with pytest.raises(GateFailure) as failure:
            check_kernel(op.reference, op.reference, make, trials=2, label="conv2d with torch's defaults")
        assert failure.value.reason == "precision_downgrade", failure.value.message
        assert check_kernel(op.reference, op.reference, make, trials=2, compute_dtype="tf32").passed
    finally:
        corpus.set_switch("torch.backends.cudnn.allow_tf32", before)


if _shard()[0] != 0:  # shard 0 runs them; the other shards do not collect them (a skip would read as unsupported)
    del test_tf32_tensor_cores_pass_only_where_declared
    del test_torchs_default_switches_fail_an_undeclared_fp32_convolution


LOW_PRECISION_SCANS = _mine([(op, dtype) for op in corpus.OPS for dtype in op.cuda_low_precision])


@pytest.mark.parametrize("case", LOW_PRECISION_SCANS, ids=corpus._id)
def test_torchs_low_precision_cuda_scans_are_rejected(case) -> None:
    """A kernel that accumulates a 32768-long scan in fp16/bf16 fails, declared or not (its error is far
    beyond what the low dtype's ceiling allows an honest kernel), while the fp32-accumulating scan passes."""
    from pytest_ditgate import GateFailure, check_kernel

    op, dtype = case
    make = op.make_inputs(dtype, "cuda")
    for declared in (None, dtype):
        with pytest.raises(GateFailure) as failure:
            check_kernel(op.reference, op.reference, make, trials=corpus.SEEDS, compute_dtype=declared,
                         **corpus.HONEST_OPTIONS)
        assert failure.value.reason == "mismatch" and "norm bound failed" in failure.value.message
    check_kernel(op.orders["fp32 math"], op.reference, make, trials=corpus.SEEDS, **corpus.HONEST_OPTIONS)


def _llm_cases() -> list:
    return _mine(llm.cases())


@pytest.mark.parametrize("item", _llm_cases(), ids=llm._id)
def test_llm_honest_variants_pass_ten_seeds_and_the_extremal_trials_on_cuda(item) -> None:
    """In-place (inout_args) and scratch kernels, degenerate RMSNorm backwards, small-magnitude bf16 gradients
    and the extremal trials, at LLM sizes (cross entropy 512 x 128256, KV cache 8 x 32 x 4096 x 128, RoPE
    4 x 4096 x 32 x 128, AdamW over 16M parameters)."""
    for name, report in llm.check_honest(*item, "cuda", gpu=True).items():
        print(f"\n{name}: {report.summary()}")


@pytest.mark.parametrize("item", _llm_cases(), ids=llm._id)
def test_llm_wrong_variants_fail_on_cuda(item) -> None:
    llm.check_wrong(*item, "cuda", gpu=True)


@pytest.mark.parametrize("name", _mine([case.name for case in llm.CASES
                                        if case.options.get("inout_args") or case.options.get("scratch_args")]))
def test_an_undeclared_in_place_kernel_fails_input_mutated_on_cuda(name) -> None:
    from pytest_ditgate import GateFailure, check_kernel

    case = next(c for c in llm.CASES if c.name == name)
    kernel = next(iter(case.honest.values()))
    declared = {k: v for k, v in case.options.items() if k not in ("inout_args", "scratch_args")}
    with pytest.raises(GateFailure) as failure:
        check_kernel(kernel, case.reference, case.inputs(case.dtypes[0], "cuda"), trials=1, **declared)
    assert failure.value.reason == "input_mutated"

