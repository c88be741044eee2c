"""The tolerance corpus: honest kernels of many reductions pass ``check_kernel``'s defaults, wrong ones fail.

Every op runs on zero-mean inputs (positive ones for the positive sums, means, matrix-vector products and
scans) in fp32, fp16 and bf16 (tf32 where declared). Honest variants (torch's own kernel, another summation
order, blocked, split-K and pairwise sums, float64-then-cast, non-contiguous inputs) must pass 10 seeds;
wrong variants (scaled by 0.1 % or 2 %, one element wrong, half written) must fail, and the precision
downgrades inside an fp32 kernel (inputs rounded to bf16 or fp16, TF32 math) must fail as
``precision_downgrade``. The same corpus runs on CUDA in ``tests/gates/test_tolerance_corpus_gpu.py``.
``python tests/plugin/test_tolerance_corpus.py`` prints the measured table of docs/kernel_check.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

import torch.nn.functional as F  # noqa: E402

from pytest_ditgate import GateFailure, check_kernel  # noqa: E402
from pytest_ditgate.correctness.inputs import make_tensor  # noqa: E402

SEEDS = 10
DTYPES = ("float32", "float16", "bfloat16")


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread: with xdist workers on a 2-core machine, torch's spinning thread pools slowed the
    corpus's many small reductions 10-60x (softmax 34 s instead of 0.5 s); the verdicts do not depend on it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# -- honest implementations in another order (numpy accumulates sequentially in float32) --------------

def _np32(t: Any) -> Any:
    return t.detach().float().cpu().numpy()


def _back(array: Any, like: Any, dtype: Any = None) -> Any:
    return torch.as_tensor(np.array(array, dtype=np.float32)).to(device=like.device, dtype=dtype or like.dtype)


def sequential_sum(x: Any, dim: int = -1) -> Any:
    """Each output summed one element after another in float32 (a naive one-thread-per-output loop)."""
    return _back(np.add.accumulate(_np32(x), axis=dim).take(-1, axis=dim), x)


def two_level_sum(x: Any) -> Any:
    """Sum of all elements as a GPU block does it: 1024 sequential chunks, then their partials in order."""
    flat = _np32(x).reshape(-1)
    flat = flat.reshape(min(1024, flat.size), -1)
    partial = np.add.accumulate(flat, axis=1)[:, -1]
    return _back(np.add.accumulate(partial)[-1], x)


def sequential_matmul(a: Any, b: Any) -> Any:
    """``a @ b`` with every output accumulated over K in order, products rounded to float32 (no FMA)."""
    products = _np32(a)[..., :, None, :] * np.swapaxes(_np32(b), -1, -2)[..., None, :, :]
    return _back(np.add.accumulate(products, axis=-1)[..., -1], a)


def split_k_matmul(a: Any, b: Any, splits: int = 4) -> Any:
    """``a @ b`` as a split-K kernel: ``splits`` float32 GEMMs over slices of K, their partials added in order."""
    size = -(-a.shape[-1] // splits)
    parts = [a[..., k:k + size].float() @ b[..., k:k + size, :].float() for k in range(0, a.shape[-1], size)]
    out = parts[0]
    for part in parts[1:]:
        out = out + part
    return out.to(a.dtype)


def pairwise_sum(x: Any) -> Any:
    """Sums over the last dim by a pairwise tree in float32 (halves added until one element is left)."""
    work = x.float()
    while work.shape[-1] > 1:
        if work.shape[-1] % 2:
            work = torch.cat([work, torch.zeros_like(work[..., :1])], -1)
        work = work[..., 0::2] + work[..., 1::2]
    return work[..., 0].to(x.dtype)


def tiled_matmul(a: Any, b: Any, tile: int = 256) -> Any:
    """``a @ b`` as a tiled kernel: float32 partial products per K tile, added to the accumulator in order."""
    acc = torch.zeros(a.shape[:-1] + b.shape[-1:], dtype=torch.float32, device=a.device)
    for k in range(0, a.shape[-1], tile):
        acc = acc + a[..., k:k + tile].float() @ b[..., k:k + tile, :].float()
    return acc.to(a.dtype)


def sequential_scan(x: Any, op: Any) -> Any:
    """cumsum / cumprod along the last dim, one element after another in float32."""
    return _back(op.accumulate(_np32(x), axis=-1), x)


# -- the ops -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Op:
    """One op of the corpus: a plain reference, its input shapes, and its honest reorderings."""

    name: str
    reference: Callable[..., Any]
    shapes: tuple[tuple[int, ...], ...]
    orders: dict[str, Callable[..., Any]] = field(default_factory=dict)  # honest variants in another order
    dtypes: tuple[str, ...] = DTYPES
    #: "normal" (zero mean), "positive" (|N(0, 1)|: sums whose terms do not cancel) or "near_one"
    #: (1 + N(0, 0.01^2): cumprod stays finite)
    inputs: str = "normal"
    gpu_shapes: tuple[tuple[int, ...], ...] | None = None  # heavier sizes on CUDA
    gpu_dtypes: tuple[str, ...] = DTYPES  # the CPU budget leaves some dtypes to the GPU corpus
    #: False where no output check can see bf16 input rounding: a scalar of positive terms averages it away
    sees_input_rounding: bool = True
    #: dtypes in which torch's own CUDA kernel accumulates in the low precision (pytorch#180150, #180155):
    #: there it is not an honest fp32-accumulating variant; tests/gates/test_tolerance_corpus_gpu.py shows
    #: the gate rejects it
    cuda_low_precision: tuple[str, ...] = ()
    #: dtypes in which torch's own kernel computes in that dtype and loses accuracy at the extremal trials'
    #: input scales (fp16 RMSNorm: squares of 1e-3-scale inputs are fp16 subnormals): its unit-scale trials
    #: pass, and ``test_low_precision_math_fails_the_extremal_trials`` shows the extremal trials reject it
    extremal_unsafe: tuple[str, ...] = ()
    #: check_kernel's ``input_scales`` where the op's valid range is narrower than the default's
    input_scales: tuple[Any, ...] | None = None
    #: the device library op it runs on CUDA ("gemm": cuBLAS, "conv": cuDNN), on which torch's reduced-precision
    #: switches act (tests/gates/test_tolerance_corpus_gpu.py measures each switch there)
    library: str | None = None

    def make_inputs(self, dtype: str, device: str = "cpu", *, gpu: bool = False) -> Callable[[int], tuple]:
        """Inputs per seed: the corpus sizes from ``make_tensor`` (the same values on every device), or with
        ``gpu`` the heavy sizes drawn on the device itself (drawing 30M float64 values on the host per
        trial cost seconds)."""
        shapes = self.gpu_shapes if gpu and self.gpu_shapes else self.shapes

        def draw(shape: tuple[int, ...], seed: int) -> Any:
            if not gpu:
                return make_tensor(shape, "float64", seed=seed, device=device)
            generator = torch.Generator(device=device).manual_seed(seed)
            return torch.randn(shape, dtype=torch.float64, device=device, generator=generator)

        def make_inputs(seed: int) -> tuple:
            out = []
            for i, shape in enumerate(shapes):
                t = draw(shape, seed * 101 + i)
                t = 1 + t / 100 if self.inputs == "near_one" else t.abs() if self.inputs == "positive" else t
                out.append(t.to(getattr(torch, dtype)))
            return tuple(out)
        return make_inputs


def _layer_norm(x, w, b):
    return F.layer_norm(x, x.shape[-1:], w, b, eps=1e-5)


def _rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def _sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


def _attention_explicit(q, k, v):
    """Attention written out: fp32 scores, softmax, fp32 PV (what a naive fused kernel computes)."""
    scores = (q.float() @ k.float().transpose(-1, -2)) / q.shape[-1] ** 0.5
    return (torch.softmax(scores, -1) @ v.float()).to(q.dtype)


def _matmul(a, b):
    return a @ b


def _losses(kind):
    """A per-row loss of predictions against targets (``reduction="none"``, then the mean of each row): one
    element per row, so the precision probe has elements to judge."""
    def loss(prediction, target):
        if kind == "cross entropy":
            return F.cross_entropy(prediction, torch.softmax(target, -1), reduction="none")
        if kind == "kl divergence":
            return F.kl_div(torch.log_softmax(prediction, -1), torch.log_softmax(target, -1), reduction="none",
                            log_target=True).sum(-1)
        if kind == "cosine":
            return 1 - F.cosine_similarity(prediction, target, dim=-1)
        per = {"mse": lambda p, t: F.mse_loss(p, t, reduction="none"),
               "huber": lambda p, t: F.huber_loss(p, t, reduction="none"),
               "hinge": lambda p, t: torch.clamp(1 - p * torch.sign(t), min=0)}[kind]
        return per(prediction, target).mean(-1)
    loss.__name__ = f"{kind.replace(' ', '_')}_per_row"
    return loss


OPS: tuple[Op, ...] = (
    Op("gemm K=4096", _matmul, ((16, 4096), (4096, 16)),
       {"sequential": sequential_matmul, "tiled": tiled_matmul, "split-K": split_k_matmul},
       gpu_shapes=((1024, 4096), (4096, 1024)), library="gemm"),
    Op("gemm K=131072", _matmul, ((2, 131072), (131072, 2)),
       {"sequential": sequential_matmul, "tiled": lambda a, b: tiled_matmul(a, b, 8192)}, dtypes=("float32",),
       gpu_dtypes=("float32", "bfloat16"),
       gpu_shapes=((64, 131072), (131072, 64)), library="gemm"),
    Op("linear K=1152", lambda x, w, b: F.linear(x, w, b), ((8, 1152), (96, 1152), (96,)),
       {"tiled": lambda x, w, b: (tiled_matmul(x, w.t(), 128).float() + b.float()).to(x.dtype)},
       gpu_shapes=((4096, 1152), (1152, 1152), (1152,)), library="gemm"),
    Op("batched gemm", torch.bmm, ((4, 16, 512), (4, 512, 16)),
       {"sequential": sequential_matmul, "tiled": tiled_matmul}, gpu_shapes=((64, 256, 1024), (64, 1024, 256)),
       library="gemm"),
    Op("matrix-vector", torch.mv, ((64, 8192), (8192,)),
       {"sequential": lambda a, x: sequential_matmul(a, x[:, None])[:, 0]},
       gpu_shapes=((8192, 8192), (8192,)), library="gemm"),
    Op("sum over 1M", lambda x: x.sum(), ((1 << 20,),), {"two-level": two_level_sum, "pairwise": pairwise_sum},
       dtypes=("float32", "bfloat16"), gpu_shapes=((1 << 23,),)),
    Op("row sums of 65536", lambda x: x.sum(-1), ((4, 65536),), {"sequential": sequential_sum}),
    Op("mean", lambda x: x.mean(-1), ((16, 4096),),
       {"sequential": lambda x: (sequential_sum(x.float()) / x.shape[-1]).to(x.dtype)}),
    Op("var", lambda x: x.var(-1), ((16, 4096),),
       {"two-pass sequential": lambda x: (sequential_sum(
           (x.float() - sequential_sum(x.float())[:, None] / x.shape[-1]) ** 2) / (x.shape[-1] - 1)).to(x.dtype)}),
    Op("layernorm", _layer_norm, ((16, 1152), (1152,), (1152,)),
       {"fp32 math": lambda x, w, b: _layer_norm(x.float(), w.float(), b.float()).to(x.dtype)}),
    Op("rmsnorm", _rms_norm, ((16, 1152), (1152,)),
       {"fp32 math": lambda x, w: _rms_norm(x.float(), w.float()).to(x.dtype)}, extremal_unsafe=("float16",)),
    Op("sum of squares of 262144", lambda x: (x * x).sum(), ((262144,),),
       {"sequential": lambda x: _back(np.add.accumulate(_np32(x) ** 2)[-1], x),
        "two-level": lambda x: two_level_sum(x.float() ** 2).to(x.dtype)},
       dtypes=("float32",), gpu_dtypes=("float32",), sees_input_rounding=False),
    Op("frobenius norm", lambda x: torch.linalg.norm(x), ((512, 512),),
       {"two-level": lambda x: two_level_sum(x.float() ** 2).sqrt().to(x.dtype)}, sees_input_rounding=False),
    Op("softmax", lambda x: torch.softmax(x, -1), ((16, 4096),),
       {"fp32 math": lambda x: torch.softmax(x.float(), -1).to(x.dtype),
        "sequential": lambda x: (torch.exp(x.float() - x.float().amax(-1, keepdim=True))
                                 / sequential_sum(torch.exp(x.float() - x.float().amax(-1, keepdim=True)))[:, None]
                                 ).to(x.dtype)}),
    Op("log-softmax", lambda x: torch.log_softmax(x, -1), ((16, 4096),),
       {"fp32 math": lambda x: torch.log_softmax(x.float(), -1).to(x.dtype)}),
    Op("cumsum of 32768", lambda x: torch.cumsum(x, -1), ((2, 32768),),
       {"sequential": lambda x: sequential_scan(x, np.add),
        "fp32 math": lambda x: torch.cumsum(x.float(), -1).to(x.dtype)}, cuda_low_precision=("float16", "bfloat16")),
    Op("cumprod of 32768", lambda x: torch.cumprod(x, -1), ((2, 32768),),
       {"sequential": lambda x: sequential_scan(x, np.multiply),
        "fp32 math": lambda x: torch.cumprod(x.float(), -1).to(x.dtype)}, inputs="near_one",
       cuda_low_precision=("float16", "bfloat16")),
    Op("conv1d", lambda x, w: F.conv1d(x, w, padding=4), ((1, 32, 256), (32, 32, 9)),
       gpu_shapes=((16, 256, 4096), (256, 256, 9)), library="conv"),
    Op("conv2d", lambda x, w: F.conv2d(x, w, padding=1), ((1, 16, 16, 16), (16, 16, 3, 3)),
       {"im2col": lambda x, w: tiled_matmul(
           w.reshape(w.shape[0], -1)[None], F.unfold(x, 3, padding=1), 32).reshape(x.shape[0], w.shape[0], *x.shape[2:])},
       gpu_shapes=((8, 256, 64, 64), (256, 256, 3, 3)), library="conv"),
    Op("attention", _sdpa, ((1, 2, 128, 64),) * 3, {"explicit": _attention_explicit},
       gpu_shapes=((8, 16, 1024, 64),) * 3),
    # positive inputs: no cancellation, so reading them as bf16 moves the output by a fraction of its rounding
    # error budget and the bound alone lets it pass (the precision probe is what fails it)
    Op("row sums of positives", lambda x: x.sum(-1), ((64, 4096),),
       {"sequential": sequential_sum, "pairwise": pairwise_sum}, inputs="positive", dtypes=("float32", "bfloat16"),
       gpu_shapes=((1024, 65536),)),
    Op("row means of positives", lambda x: x.mean(-1), ((64, 4096),),
       {"pairwise": lambda x: (pairwise_sum(x.float()) / x.shape[-1]).to(x.dtype)}, inputs="positive",
       dtypes=("float32", "bfloat16")),
    Op("matrix-vector of positives", torch.mv, ((256, 4096), (4096,)),
       {"sequential": lambda a, x: sequential_matmul(a, x[:, None])[:, 0],
        "split-K": lambda a, x: split_k_matmul(a, x[:, None])[:, 0]},
       inputs="positive", dtypes=("float32", "bfloat16"), gpu_shapes=((8192, 8192), (8192,)), library="gemm"),
    Op("cumsum of positives", lambda x: torch.cumsum(x, -1), ((4, 4096),),
       {"sequential": lambda x: sequential_scan(x, np.add)}, inputs="positive", dtypes=("float32", "bfloat16")),
    # torch's CUDA bf16 scan is not marked low-precision here: over 4096 positive terms its error stays within
    # bf16's bound at every trial (an H100, 10 seeds and the extremal trials), so no check can tell it apart
    Op("row max", lambda x: x.amax(-1), ((64, 512),), dtypes=("float32", "bfloat16")),
    *(Op(f"{kind} loss per row", _losses(kind), ((64, 1024), (64, 1024)), dtypes=("float32",))
      for kind in ("mse", "cross entropy", "huber", "cosine", "hinge")),
    # at inputs x 1e-3 both distributions are nearly uniform and the divergence (about 1e-6) is the difference
    # of O(1) terms: torch's own fp32 kernel errs by 23 % there, the formula's conditioning, not the kernel's
    Op("kl divergence loss per row", _losses("kl divergence"), ((64, 1024), (64, 1024)), dtypes=("float32",),
       input_scales=(1e3,)),
)


#: fp16 GEMM/conv/attention have no fast CPU kernels: their fp16 cases run in the GPU corpus only
OPS = tuple(replace(op, dtypes=("float32", "bfloat16"))
            if op.name in ("linear K=1152", "batched gemm", "conv1d", "conv2d", "attention") else op for op in OPS)


def float64_then_cast(reference: Callable[..., Any]) -> Callable[..., Any]:
    def kernel(*args):
        return reference(*(a.double() for a in args)).to(args[0].dtype)
    return kernel


def noncontiguous(reference: Callable[..., Any]) -> Callable[..., Any]:
    """The reference on copies of the inputs with every other element of a twice-as-wide buffer."""
    def kernel(*args):
        copies = []
        for a in args:
            wide = torch.zeros(a.shape[:-1] + (2 * a.shape[-1],), dtype=a.dtype, device=a.device)
            wide[..., ::2] = a
            copies.append(wide[..., ::2])
        return reference(*copies)
    return kernel


def honest_variants(op: Op, dtype: str | None = None, device: str = "cpu") -> dict[str, Callable[..., Any]]:
    """torch's kernel (contiguous and not), float64-then-cast and the op's other orders; torch's kernel is
    left out where on this device it accumulates in the low precision (``Op.cuda_low_precision``)."""
    variants = {"torch": op.reference, "float64-then-cast": float64_then_cast(op.reference),
                "non-contiguous": noncontiguous(op.reference), **op.orders}
    if str(device).startswith("cuda") and dtype in op.cuda_low_precision:
        del variants["torch"], variants["non-contiguous"]
    return variants


#: the honest variants that compute in the inputs' own dtype
LOW_PRECISION_MATH = ("torch", "non-contiguous")


def scaled(reference: Callable[..., Any], factor: float) -> Callable[..., Any]:
    return lambda *args: (reference(*args).double() * factor).to(reference(*args).dtype)


def bf16_inputs(reference: Callable[..., Any]) -> Callable[..., Any]:
    """An fp32 kernel that reads its inputs as bf16 (bf16 math inside an fp32 kernel)."""
    return lambda *args: reference(*(a.to(torch.bfloat16).to(a.dtype) for a in args))


def _tf32(t: Any) -> Any:
    """``t`` rounded to TF32 (10 explicit mantissa bits), as tensor cores read fp32 operands."""
    bits = t.float().contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def fp16_inputs(reference: Callable[..., Any]) -> Callable[..., Any]:
    """An fp32 kernel that reads its inputs as fp16."""
    return lambda *args: reference(*(a.to(torch.float16).to(a.dtype) for a in args))


def tf32_math(reference: Callable[..., Any]) -> Callable[..., Any]:
    """An fp32 kernel on TF32 tensor cores, emulated: every operand rounded to 10 explicit mantissa bits."""
    return lambda *args: reference(*(_tf32(a) for a in args))


#: the downgrades inside an fp32 kernel: each must fail as ``precision_downgrade``
DOWNGRADES = {"bf16 inputs": bf16_inputs, "fp16 inputs": fp16_inputs, "tf32 math": tf32_math}

#: an output needs this many elements for the precision probe to judge it at its 1e-4 false-alarm bound:
#: below it (a handful of long sums) the error bound is what catches a downgrade, when it does
PROBED_ELEMENTS = 16


def one_element_wrong(reference: Callable[..., Any]) -> Callable[..., Any]:
    def kernel(*args):
        out = reference(*args).clone(memory_format=torch.contiguous_format)  # CUDA SDPA returns a strided view
        flat = out.view(-1)
        index = flat.numel() // 3
        flat[index] = flat[index] + flat.abs().amax()  # off by the output's largest magnitude (a misplaced value)
        return out
    return kernel


def half_written(reference: Callable[..., Any]) -> Callable[..., Any]:
    def kernel(*args):
        full = reference(*args)
        out = torch.empty_like(full, memory_format=torch.contiguous_format)  # poisoned: the unwritten half shows
        out.view(-1)[: full.numel() // 2] = full.reshape(-1)[: full.numel() // 2]
        return out
    return kernel


def wrong_variants(op: Op, dtype: str) -> dict[str, tuple[Callable[..., Any], tuple[str, ...]]]:
    """name -> (kernel, accepted reasons). 0.1 % and bf16 inputs only where fp32 can see them."""
    ref = op.reference
    wrong: dict[str, tuple[Callable[..., Any], tuple[str, ...]]] = {
        "2 % scale": (scaled(ref, 1.02), ("mismatch",)),
        "one element wrong": (one_element_wrong(ref), ("mismatch",)),
    }
    if dtype == "float32":
        wrong["0.1 % scale"] = (scaled(ref, 1.001), ("mismatch",))
        if op.sees_input_rounding and probed(op):
            wrong.update({name: (downgrade(ref), ("precision_downgrade",)) for name, downgrade in DOWNGRADES.items()})
        elif op.sees_input_rounding:  # too few outputs for the probe at the CPU sizes: the bound sees bf16
            # inputs (fp16 and TF32 err 8x less: not asserted); at the GPU sizes the probe may see them first
            wrong["bf16 inputs"] = (bf16_inputs(ref), ("mismatch", "precision_downgrade"))
    return wrong


def probed(op: Op) -> bool:
    """Whether the op's output has enough elements for the precision probe to judge (at the CPU sizes)."""
    return op.reference(*op.make_inputs("float32")(0)).numel() >= PROBED_ELEMENTS


def cases(dtypes: tuple[str, ...] = DTYPES) -> list[tuple[Op, str]]:
    return [(op, dtype) for op in OPS for dtype in op.dtypes if dtype in dtypes]


def _id(case: tuple[Op, str]) -> str:
    return f"{case[0].name} {case[1]}"


CASES = cases()


#: the corpus judges tolerances: the determinism re-run and memory poisoning (tested elsewhere) are skipped
HONEST_OPTIONS = {"check_determinism": False, "poison_memory": False}


def _scales(op: Op) -> dict[str, Any]:
    """The op's own ``input_scales`` as check_kernel options (none: the default)."""
    return {} if op.input_scales is None else {"input_scales": op.input_scales}


def check_honest(op: Op, dtype: str, device: str = "cpu", *, gpu: bool = False,
                 extra: dict[str, Callable[..., Any]] | None = None, **options: Any) -> dict[str, Any]:
    """Every honest variant of ``op`` in ``dtype`` passes ``SEEDS`` seeds; returns the reports by variant."""
    make = op.make_inputs(dtype, device, gpu=gpu)
    reports = {}
    for name, kernel in {**honest_variants(op, dtype, device), **(extra or {})}.items():
        unit_scale = {"input_scales": ()} if dtype in op.extremal_unsafe and name in LOW_PRECISION_MATH else \
            _scales(op)
        try:
            reports[name] = check_kernel(kernel, op.reference, make, trials=SEEDS, label=f"{op.name} {dtype} {name}",
                                         **{**HONEST_OPTIONS, **unit_scale, **options})
        except GateFailure as failure:
            raise AssertionError(f"false rejection of the honest variant {name!r}:\n{failure.message}") from None
    return reports


def check_wrong(op: Op, dtype: str, device: str = "cpu", *, gpu: bool = False, **options: Any) -> dict[str, str]:
    """Every wrong variant of ``op`` in ``dtype`` fails with an accepted reason; returns the reasons."""
    make = op.make_inputs(dtype, device, gpu=gpu)
    reasons = {}
    variants = {**wrong_variants(op, dtype), "half written": (half_written(op.reference), ("stale_output",))}
    if op.reference(*make(0)).numel() < 2:
        del variants["half written"], variants["one element wrong"]  # a scalar has no half and no other element
    for name, (kernel, accepted) in variants.items():
        with pytest.raises(GateFailure) as failure:
            check_kernel(kernel, op.reference, make, trials=SEEDS, label=f"{op.name} {dtype} {name}",
                         **{**_scales(op), **options})
        assert failure.value.reason in accepted, (name, failure.value.message)
        reasons[name] = failure.value.reason
    return reasons


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_honest_variants_pass_ten_seeds(case: tuple[Op, str]) -> None:
    check_honest(*case)


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_wrong_variants_fail(case: tuple[Op, str]) -> None:
    check_wrong(*case)


def test_the_corpus_covers_forty_cases_over_three_dtypes() -> None:
    assert len(CASES) >= 40 and len(OPS) >= 20 and {dtype for _, dtype in CASES} == set(DTYPES)


@pytest.mark.parametrize("case", [(op, dtype) for op in OPS for dtype in op.extremal_unsafe], ids=_id)
def test_low_precision_math_fails_the_extremal_trials(case: tuple[Op, str]) -> None:
    """torch's own fp16 RMSNorm squares its inputs in fp16: at 1e-3 they are subnormals, and the extremal
    trial rejects it, while the same op with fp32 math passes every trial."""
    op, dtype = case
    make = op.make_inputs(dtype)
    with pytest.raises(GateFailure) as failure:
        check_kernel(op.reference, op.reference, make, trials=SEEDS, **HONEST_OPTIONS)
    assert failure.value.reason == "mismatch" and "extremal trial" in failure.value.message.splitlines()[0]
    check_kernel(op.orders["fp32 math"], op.reference, make, trials=SEEDS, **HONEST_OPTIONS)


def test_tf32_math_passes_only_where_declared() -> None:
    op = OPS[0]
    tf32 = lambda a, b: _tf32(a) @ _tf32(b)  # noqa: E731
    make = op.make_inputs("float32")
    assert check_kernel(tf32, op.reference, make, trials=SEEDS, compute_dtype="tf32").passed
    with pytest.raises(GateFailure) as failure:
        check_kernel(tf32, op.reference, make, trials=SEEDS)
    assert failure.value.reason == "precision_downgrade"
    with pytest.raises(GateFailure) as failure:  # bf16 operands are 8x coarser than the tf32 it declares
        check_kernel(bf16_inputs(op.reference), op.reference, make, trials=SEEDS, compute_dtype="tf32")
    assert failure.value.reason == "precision_downgrade"


# -- torch's reduced-precision switches (measured on CUDA: tests/gates/test_tolerance_corpus_gpu.py and
#    benchmarks/precision_probe_switches.py; on a CPU they change nothing) ----------------------------------

#: switch -> (the corpus dtype it acts on, the library op kind, the compute_dtype that declares it)
SWITCHES = {
    "torch.backends.cuda.matmul.allow_tf32": ("float32", "gemm", "tf32"),
    "torch.backends.cudnn.allow_tf32": ("float32", "conv", "tf32"),
    "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction": ("float16", "gemm", "float16"),
    "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction": ("bfloat16", "gemm", "bfloat16"),
}


def set_switch(switch: str, value: bool) -> bool:
    """Set a ``torch.backends`` switch by its dotted name; returns its value before."""
    import operator

    import torch

    owner, attribute = switch.removeprefix("torch.").rsplit(".", 1)
    holder = operator.attrgetter(owner)(torch)
    before = getattr(holder, attribute)
    setattr(holder, attribute, value)
    return before


def under(switch: str, kernel, value: bool = True):
    """``kernel`` with ``switch`` set to ``value`` (on) around its call (restored after): a candidate that runs
    under it."""
    def candidate(*args):
        before = set_switch(switch, value)
        try:
            return kernel(*args)
        finally:
            set_switch(switch, before)
    return candidate


def changes_the_result(switch: str, op, make, seeds: int = 2) -> bool:
    """Whether the op's output on the first seeds differs, bit for bit, with the switch on and off (both set
    explicitly: the caller may have turned it on already)."""
    import torch

    for seed in range(seeds):
        args = make(seed)
        if not torch.equal(under(switch, op.reference, True)(*args), under(switch, op.reference, False)(*args)):
            return True
    return False


def test_a_switch_changes_the_result_even_when_the_caller_turned_it_on(monkeypatch) -> None:
    # the GPU test of cuDNN's default TF32 turns the switch on first; a comparison against the current setting
    # then compared on with on and reported "no effect"
    import torch

    monkeypatch.setattr(torch.backends, "ditgate_coarse", False, raising=False)
    op = replace(OPS[0], reference=lambda a, b: (a @ b).round() if torch.backends.ditgate_coarse else a @ b)
    make = op.make_inputs("float32")
    set_switch("torch.backends.ditgate_coarse", True)
    assert changes_the_result("torch.backends.ditgate_coarse", op, make)
    assert torch.backends.ditgate_coarse is True  # left as the caller set it
    plain = replace(OPS[0], reference=lambda a, b: a @ b)
    assert not changes_the_result("torch.backends.ditgate_coarse", plain, make)


# -- measured table (python tests/plugin/test_tolerance_corpus.py) -------------------------------------

def derived_comparison(kernel: Callable[..., Any], reference: Callable[..., Any], inputs: tuple) -> Any:
    """``kernel``'s one output against the float64 reference under the derived bound, made also where the
    table's bound holds (``check_kernel`` derives it only where the table fails); the table reports these."""
    from pytest_ditgate.correctness import compare, honest
    from pytest_ditgate.correctness.tolerances import accumulation_roundoff, rel_norm_ceiling, tolerance_for

    candidate = kernel(*(a.clone() for a in inputs))
    ref = reference(*(a.double() for a in inputs))
    with honest.candidate_precision(tf32=False, reduced_precision_reduction=False):
        same = reference(*(a.clone() for a in inputs))
    magnitude = reference(*(a.float().abs() for a in inputs))  # as check_kernel: a magnitude needs no float64
    tolerance = tolerance_for(candidate.dtype)
    floating = sum(a.numel() for a in inputs if a.is_floating_point())
    bound = honest.estimate(ref, same, magnitude, table=tolerance.rel_norm,
                            roundoff=accumulation_roundoff(candidate.dtype, None),
                            ceiling=rel_norm_ceiling(candidate.dtype, None),
                            inputs_per_output=floating / ref.numel() if ref.numel() else None,
                            output_dtype=candidate.dtype)
    return compare.compare_output("out", candidate, ref, tolerance, bound, compare.local_scale(magnitude, ref))


def test_the_tables_derived_bound_is_check_kernels() -> None:
    """Where ``check_kernel`` derives a bound (its table fails), the table's producer derives the same one."""
    op = next(op for op in OPS if op.name == "gemm K=131072")  # long sums: the derived bound exceeds the table's
    make = op.make_inputs("float32")
    with pytest.raises(GateFailure) as failure:
        check_kernel(scaled(op.reference, 1.02), op.reference, make, trials=1, **HONEST_OPTIONS)
    gate = failure.value.report.trials[0].outputs[0]
    ours = derived_comparison(scaled(op.reference, 1.02), op.reference, make(0))
    assert gate.honest.source != "table" and ours.honest.bound == pytest.approx(gate.honest.bound, rel=1e-12)
    assert (ours.norm_ratio, ours.elementwise_ratio) == pytest.approx((gate.norm_ratio, gate.elementwise_ratio))


def _measure(dtypes: tuple[str, ...] = DTYPES) -> None:  # pragma: no cover - prints docs/kernel_check.md's table
    """Worst honest variant per case (error / bound, elementwise and norm), and the old dtype-only rule's verdict."""
    from unittest import mock

    from pytest_ditgate.correctness import tolerances

    # the old rule's atol was absolute (the table's is now relative to the output's mean magnitude)
    old_table = {name: replace(tol, atol_relative=False) for name, tol in tolerances.TOLERANCES.items()}
    old_table["float32"] = tolerances.Tolerance(1.3e-6, 1e-5, 1e-5, atol_relative=False)
    print("| op | dtype | worst honest: norm err/bound, element err/allowance (variant; bound from) | "
          "old rule (dtype table only) rejects |")
    print("|---|---|---|---|")
    for op, dtype in cases(dtypes):
        check_honest(op, dtype)
        make = op.make_inputs(dtype)
        outs = [(derived_comparison(kernel, op.reference, make(seed)), name)
                for name, kernel in honest_variants(op).items() for seed in range(SEEDS)]
        norm, variant = max(((o.norm_ratio, name) for o, name in outs))
        element = max(o.elementwise_ratio for o, _ in outs)
        source = sorted({o.honest.source for o, _ in outs})
        rejected = []
        old_rule = tolerances.HonestRule(same_precision=0.0, magnitude=0.0, length=0.0, elementwise=0.0,
                                         conditioning=0.0, representable=0.0)
        with mock.patch.object(tolerances, "HONEST_RULE", old_rule), mock.patch.dict(tolerances.TOLERANCES, old_table):
            for name, kernel in honest_variants(op).items():
                try:
                    check_kernel(kernel, op.reference, op.make_inputs(dtype), trials=SEEDS, input_scales=(),
                                 **HONEST_OPTIONS)  # the old rule had no extremal trials
                except GateFailure:
                    rejected.append(name)
        print(f"| {op.name} | {dtype} | {norm:.2f}, {element:.2f} ({variant}; {'/'.join(source)}) | "
              f"{', '.join(rejected) or '-'} |", flush=True)


if __name__ == "__main__":
    import sys

    torch.set_num_threads(1)  # as in the tests: torch's non-contiguous reductions are then sequential
    _measure(tuple(sys.argv[1:]) or DTYPES)
