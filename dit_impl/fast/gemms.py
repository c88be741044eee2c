"""Which library runs a block's QKV and fc1 (+GELU) GEMMs: cuBLAS through PyTorch, or quack's CuTe-DSL
Hopper GEMMs (``gemm=quack``: both; ``gemm=quack_fc1``: fc1 + GELU only).

As isolated GEMMs quack is faster than cuBLAS at DiT-XL/2's shapes for these two only (fc1 with its
GELU epilogue at 0.77x of cuBLASLt's, QKV at 0.93x; ``benchmarks/results/quack_gemm_sm_90.txt``);
attention-out and fc2 stay in cuBLAS, where quack is slower. Inside the forward's CUDA graph, cuBLAS's QKV
runs faster than quack's (``benchmarks/results/dit_bench_profile_final_sm_90.txt``), hence ``quack_fc1``; but
the whole forward is slower with it than with ``quack`` (QKV's tile-counter memset and its gaps come
back; ``benchmarks/results/dit_bench_profile_rated_sm_90.txt``), so ``quack`` is the fastest set.
``resolve_gemms`` decides once and says why, so a fall-back to cuBLAS is reported, never silent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from pytest_ditgate.bench.rated import rated

#: quack's name for GELU with the tanh approximation (diffusers' DiT MLP activation)
GELU_TANH = "gelu_tanh_approx"


@dataclass(frozen=True)
class BlockGemms:
    """The GEMMs a block hands to another library (``None``: its own ``nn.Linear``), and why."""

    impl: str  # "cublas", "quack" or "quack_fc1"
    reason: str
    qkv: Callable[[Any, Any], Any] | None = None  # (x, linear) -> linear(x)
    fc1_gelu: Callable[[Any, Any], Any] | None = None  # (x, linear) -> gelu_tanh(linear(x))


def cublas(reason: str) -> BlockGemms:
    return BlockGemms("cublas", reason)


def _gemm_amounts(flat: Any, linear: Any) -> dict[str, Any]:
    """FLOPs of ``flat @ W.T`` (2 M N K) and its dtype, for the profile (quack's launches have no op)."""
    m, k = flat.shape
    return {"flops": 2 * m * k * linear.weight.shape[0], "dtype": flat.dtype}


def quack_gemms(interface: Any, version: str, fused_qkv: bool = True, qkv_too: bool = True) -> BlockGemms:
    """The fused QKV (unless ``qkv_too`` is false) and fc1 + GELU as quack GEMMs from ``interface``
    (``quack.gemm_interface``), bias and GELU in the epilogue; operands are the flattened tokens and the
    weight's transpose (a view, no copy). Three separate projections (``fused_qkv=0``) stay in cuBLAS."""

    def qkv(x: Any, linear: Any) -> Any:
        flat = x.reshape(-1, x.shape[-1])
        with rated("quack qkv", **_gemm_amounts(flat, linear)):
            out = interface.gemm(flat, linear.weight.t(), bias=linear.bias)
        return out.view(*x.shape[:-1], out.shape[-1])

    def fc1_gelu(x: Any, linear: Any) -> Any:
        flat = x.reshape(-1, x.shape[-1])
        with rated("quack fc1+gelu", **_gemm_amounts(flat, linear)):
            _, out = interface.gemm_act(flat, linear.weight.t(), bias=linear.bias, activation=GELU_TANH,
                                        store_preact=False)
        return out.view(*x.shape[:-1], out.shape[-1])

    if not qkv_too:
        return BlockGemms("quack_fc1", f"quack {version}: fc1 + GELU (gemm_act); QKV, attention-out and fc2 in "
                          "cuBLAS", None, fc1_gelu)
    if not fused_qkv:
        return BlockGemms("quack", f"quack {version}: fc1 + GELU (gemm_act); the three Q, K, V projections "
                          "(fused_qkv=0), attention-out and fc2 in cuBLAS", None, fc1_gelu)
    return BlockGemms("quack", f"quack {version}: QKV (gemm) and fc1 + GELU (gemm_act); attention-out and "
                      "fc2 in cuBLAS", qkv, fc1_gelu)


def resolve_gemms(mode: str, device: Any, dtype: Any, compiled: bool, fused_qkv: bool = True) -> BlockGemms:
    """cuBLAS, or quack's GEMMs where ``mode`` asks for them and they can run; never raises."""
    import torch

    if mode == "cublas":
        return cublas("requested")
    if device.type != "cuda":
        return cublas(f"quack's GEMMs need CUDA tensors, model is on {device.type}")
    if dtype not in (torch.bfloat16, torch.float16):
        return cublas(f"quack's GEMMs take bf16 or fp16 operands, model is {str(dtype).replace('torch.', '')}")
    if compiled:
        return cublas("compiled blocks: inductor traces cuBLAS, not the DSL's kernel launches")
    major, minor = torch.cuda.get_device_capability(device)
    if major < 9:
        return cublas(f"quack's GEMMs are Hopper (sm_90) kernels or newer; device is sm_{major}{minor}")
    try:
        import quack
        from quack import gemm_interface
    except Exception as exc:  # noqa: BLE001 - any import failure means the fall-back, with its reason
        return cublas(f"quack-kernels not importable: {type(exc).__name__}: {exc}")
    return quack_gemms(gemm_interface, getattr(quack, "__version__", "?"), fused_qkv, qkv_too=mode == "quack")
