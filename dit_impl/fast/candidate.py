"""The candidate that the DiT experiment lane judges (a mutable path: an experiment edits this file).

``OPTIONS`` picks the fast implementation's switches on a GPU; on the CPU the lane runs the same
implementation in float32 with the CUDA-only switches off (``options_for``). ``SAMPLER`` is how the candidate
samples (``dit_impl/fast/sampler.py``): its default is the baseline's loop, bitwise. One causal hypothesis per
commit: change one switch, commit, run the lane (docs/agent_loop.md). What each class looks like here:

* numerical: ``dtype="float16"``, or ``dtype="float32", tf32=True``;
* approximate: ``SAMPLER = SamplerOptions(step_fraction=0.5)`` (or ``steps``, ``scheduler``,
  ``guidance_cutoff``, ``block_cache``);
* quantization: ``quant="fp8"`` (fp8 GEMMs, sm_89+), ``"int8_weight"``, ``"fp8_weight"``.
"""

from __future__ import annotations

from dit_impl.fast.options import FastOptions
from dit_impl.fast.sampler import SamplerOptions

#: the candidate's switches on a CUDA device
OPTIONS = FastOptions(dtype="bfloat16", sdpa="auto", fused_qkv=True, batched_conditioning=True,
                      gelu_epilogue=False, adaln="torch", compile="off", cuda_graphs=False)

#: how the candidate samples a corpus case (the default: as the baseline does)
SAMPLER = SamplerOptions()


def options_for(device_type: str) -> FastOptions:
    """``OPTIONS`` on CUDA; on the CPU float32 and no CUDA-only switch (graphs, GELU epilogue, kernels, quack,
    TF32), fp8 GEMMs emulated by float GEMMs of the same roundings."""
    if device_type == "cuda":
        return OPTIONS
    return OPTIONS.replace(dtype="float32", cuda_graphs=False, gelu_epilogue=False, adaln="torch",
                           compile="off", sdpa="math", gemm="cublas", tf32=False, fp8_emulate=True)
