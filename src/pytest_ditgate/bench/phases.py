"""Which phase a device kernel (or, on the CPU, a host op) belongs to: an ordered table of name rules.

The first rule whose pattern is found in the name (case-insensitive ``re.search``) decides; a name no
rule matches is ``other``. ``idle`` is never a kernel: it is the time between kernels inside a profiled
call. The order matters where names carry two vocabularies:

- ``copy`` first: the profiler names copy-engine work ``Memcpy HtoD (Pageable -> Device)`` /
  ``Memset (Device)``. Copies done *by a kernel* (``direct_copy_kernel_cuda``, ``CatArrayBatchedCopy``)
  are elementwise kernels, not copies.
- inductor's pointwise and reduction kernels (``triton_poi_``/``triton_red_``/``triton_per_``) before
  attention and GEMM: they are named after the ops they fuse, so ``triton_poi_fused_addmm_gelu_1`` is the
  epilogue of an addmm, not a GEMM.
- attention before GEMM: fused attention kernels are built from GEMM pieces
  (``fmha_cutlassF_...``, ``cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_...``,
  ``cutlass::device_kernel<flash::FlashAttnFwdSm90<...>>``).
- GEMM before elementwise: ``sm90_xmma_gemm_..._cublas`` must not fall to a generic word.

Unfused attention (the ``math`` SDPA backend) shows up as its pieces: two GEMMs and a softmax, so as
``gemm`` and ``elementwise``. Torch-free; the table is documented in docs/profiling.md.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

#: display order; ``idle`` is computed, never matched
PHASES = ("gemm", "attention", "elementwise", "copy", "other", "idle")
LABELS = {"gemm": "GEMM", "attention": "attention", "elementwise": "norm/elementwise", "copy": "memcpy/memset",
          "other": "other", "idle": "idle gaps"}


@dataclass(frozen=True)
class Rule:
    """``phase`` for names in which ``pattern`` is found (case-insensitive)."""

    phase: str
    pattern: str
    why: str

    @functools.cached_property
    def regex(self) -> re.Pattern[str]:
        return re.compile(self.pattern, re.IGNORECASE)


RULES: tuple[Rule, ...] = (
    Rule("copy", r"\bmem(cpy|set)\b", "copy-engine transfers and fills as the profiler names them"),
    Rule("elementwise", r"^triton_(poi|red|per)_",
         "inductor pointwise / reduction kernels (named after the ops they fuse, e.g. addmm epilogues)"),
    Rule("attention", r"flash|fmha|attention|attn|sdpa|cudnn.*mha|\bmha_",
         "fused attention: FlashAttention 2/3, mem-efficient (fmha_cutlass), cuDNN SDPA, flex"),
    Rule("gemm", r"gemm|gemv|cutlass|cublas|xmma|nvjet|wgmma|matmul|splitkreduce|^triton_tem_|"
                 r"^aten::\w*(mm|conv|linear)",
         "cuBLAS (sm90_xmma_*, nvjet_*, ampere_*gemm), CUTLASS, gemv, split-K reduce, inductor templates "
         "(matmuls with fused epilogues; a flex-attention template counts here too); on the CPU "
         "aten::mm/addmm/bmm/linear/conv"),
    Rule("elementwise",
         r"norm|elementwise|vectorized|reduce|softmax|gelu|silu|relu|tanh|sigmoid|clamp|fill|copy|index|rsqrt|"
         r"quant|modulate|adaln|residual|rotary|triton_|"
         r"(^|[^a-z])(add|mul|div|sub|exp|pow|cat|sum|mean|where|scale|rope)([^a-z]|$)",
         "normalisation, activations and the other elementwise / reduction kernels (torch, triton, custom)"),
)


@functools.lru_cache(maxsize=4096)
def classify(name: str) -> str:
    """The phase of a kernel or op named ``name``: the first matching rule's, else ``other``."""
    rule = matching_rule(name)
    return "other" if rule is None else rule.phase


def matching_rule(name: str) -> Rule | None:
    """The rule that decides ``name`` (None: ``other``); for tests and explanations."""
    return next((rule for rule in RULES if rule.regex.search(name)), None)
