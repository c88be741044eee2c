"""The switches of the fast DiT: one frozen dataclass, so each combination is its own named experiment.

``FastOptions.parse("fused_qkv=0,sdpa=flash")`` builds one from text (benchmark and CLI use), ``label``
names it back, and ``validate`` rejects contradictions with a message naming the offending field.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

SDPA_BACKENDS = ("auto", "flash", "cudnn", "efficient", "math")
ADALN_MODES = ("torch", "kernels", "auto")
COMPILE_MODES = ("off", "blocks")
GEMM_LIBRARIES = ("cublas", "quack", "quack_fc1")
DTYPES = ("float32", "bfloat16", "float16")
#: low-bit GEMMs of the blocks' linears (``dit_impl/fast/quant.py``): weight-only int8 or fp8 (dequantized per
#: call), fp8 GEMMs through ``torch._scaled_mm`` (per-token activations x per-channel weights, or per-tensor
#: scales; sm_89+), and int4 without scales (a harmful control: most weights round to zero)
QUANT_MODES = ("none", "int8_weight", "fp8_weight", "fp8", "fp8_tensor", "int4_noscale")


@dataclass(frozen=True)
class FastOptions:
    """Which optimisations the fast DiT uses; every field defaults to the fastest CPU-valid choice."""

    #: one [3D, D] projection instead of three (weights concatenated at load)
    fused_qkv: bool = True
    #: SDPA backend: a named one (raises if it cannot run the shape), or ``auto`` (flash > cudnn >
    #: efficient > math, whichever runs first); what actually ran is probed and reported
    sdpa: str = "auto"
    #: adaLN modulate and gated residual: PyTorch ops, the fused CUDA kernels of ``kernels/``, or
    #: ``auto`` (kernels on CUDA where importable, else PyTorch; the fallback is reported)
    adaln: str = "torch"
    #: all blocks' conditioning (timestep MLP, label table, adaLN linear) in batched matmuls
    batched_conditioning: bool = True
    #: fc1 + bias + GELU-tanh as one cuBLASLt matmul with a GELU epilogue (``torch._addmm_activation``)
    gelu_epilogue: bool = False
    #: each block ends in the fused gated residual + the next LayerNorm and modulation (the last block's
    #: into the output modulation): one adaLN kernel fewer per block; a block then returns (x, next input)
    block_seam: bool = False
    #: the blocks' QKV and fc1 (+GELU) GEMMs: cuBLAS, or quack's CuTe-DSL Hopper GEMMs (bf16/fp16 on sm_90+,
    #: eager or graphed; elsewhere cuBLAS, the fall-back reported): ``quack`` both, ``quack_fc1`` fc1 + GELU
    #: only (its QKV GEMM is cuBLAS's, faster alone, but the forward measured slower: see fast/gemms.py);
    #: attention-out and fc2 stay in cuBLAS
    gemm: str = "cublas"
    #: regional compilation: ``blocks`` compiles each transformer block, never the whole model
    compile: str = "off"
    #: ``torch.compile`` mode for the blocks (``default``, ``max-autotune-no-cudagraphs``, ...)
    compile_mode: str = "default"
    #: replay a captured CUDA graph per (batch, shape, dtype) bucket (CUDA only; static input buffers)
    cuda_graphs: bool = False
    #: parameter and activation dtype
    dtype: str = "bfloat16"
    #: float32 matmuls and convolutions of the forward in TF32 (CUDA): switched on around each forward only,
    #: the previous settings restored after it (a ``numerical`` change of float32 models)
    tf32: bool = False
    #: the blocks' linears (QKV, attention-out, fc1, fc2) in low bit (``QUANT_MODES``; a ``quantization``
    #: change): ``fp8``/``fp8_tensor`` need fp8 GEMMs (CUDA sm_89+) and are refused elsewhere with the reason
    quant: str = "none"
    #: run ``fp8``/``fp8_tensor`` as float GEMMs of the dequantized operands where fp8 GEMMs cannot run (the CPU
    #: lane's stand-in: the same roundings of weights and activations, none of the speed)
    fp8_emulate: bool = False
    #: raise instead of warning when an explicitly chosen fast path falls back (math SDPA, no kernels)
    strict: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the field whose value is unknown."""
        for name, allowed in (("sdpa", SDPA_BACKENDS), ("adaln", ADALN_MODES), ("compile", COMPILE_MODES),
                              ("gemm", GEMM_LIBRARIES), ("dtype", DTYPES), ("quant", QUANT_MODES)):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"FastOptions.{name}={value!r} is not one of {', '.join(allowed)}")

    @property
    def torch_dtype(self) -> Any:
        import torch

        return getattr(torch, self.dtype)

    def replace(self, **changes: Any) -> "FastOptions":
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def label(self) -> str:
        """Short name listing only the fields that differ from the defaults (``default`` if none)."""
        base = FastOptions()
        parts = [f"{f.name}={_fmt(getattr(self, f.name))}" for f in fields(self)
                 if getattr(self, f.name) != getattr(base, f.name)]
        return ",".join(parts) or "default"

    @classmethod
    def parse(cls, text: str, base: "FastOptions | None" = None) -> "FastOptions":
        """Options from ``"field=value,field=value"`` on top of ``base`` (booleans as 1/0/true/false)."""
        base = base or cls()
        kinds = {f.name: f.type for f in fields(cls)}
        changes: dict[str, Any] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            if item == "default":
                continue
            key, sep, value = item.partition("=")
            key = key.strip()
            if not sep or key not in kinds:
                raise ValueError(f"bad option {item!r} in {text!r}; fields: {', '.join(kinds)}")
            changes[key] = _parse_bool(key, value) if kinds[key] in ("bool", bool) else value.strip()
        return replace(base, **changes)


def _fmt(value: Any) -> str:
    return str(int(value)) if isinstance(value, bool) else str(value)


def _parse_bool(key: str, value: str) -> bool:
    text = value.strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"option {key}={value!r} is not a boolean (1/0/true/false)")
