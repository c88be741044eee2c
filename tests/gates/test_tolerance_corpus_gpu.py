"""The tolerance corpus on CUDA: the same ops, honest and wrong variants as the CPU corpus
(``tests/plugin/test_tolerance_corpus.py``) at its sizes, then cuBLAS/cuDNN/SDPA, float64-then-cast,
non-contiguous and (fp32) ``torch.compile`` variants at heavier sizes. TF32 and fp16/bf16 reduced-precision
GEMM reductions are off except in the test that declares ``compute_dtype="tf32"``.
Run with ``pytest --ditgate tests/gates/test_tolerance_corpus_gpu.py -v -rs``.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.requires_gpu(why="the tolerance corpus on CUDA tensors")

corpus = pytest.importorskip("tests.plugin.test_tolerance_corpus")


def _gpu_cases() -> list:
    return [(op, dtype) for op in corpus.OPS for dtype in op.gpu_dtypes]


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
    variants = {"torch": op.reference, "float64-then-cast": corpus.float64_then_cast(op.reference),
                "non-contiguous": corpus.noncontiguous(op.reference)}
    if dtype == "float32":
        variants["compiled"] = _compiled(op)
    check = functools.partial(corpus.check_kernel, trials=corpus.SEEDS, **corpus.HONEST_OPTIONS)
    for name, kernel in variants.items():
        report = check(kernel, op.reference, make, label=f"{op.name} {dtype} {name} (GPU sizes)")
        print(f"\n{report.summary()}")


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
    assert failure.value.reason == "mismatch"
