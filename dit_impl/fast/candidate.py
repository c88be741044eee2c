"""The candidate that the DiT experiment lane judges (a mutable path: an experiment edits this file).

``OPTIONS`` picks the fast implementation's switches on a GPU; on the CPU the lane runs the same
implementation in float32 with the CUDA-only switches off (``options_for``). One causal hypothesis per
commit: change one switch, commit, run the lane (docs/agent_loop.md).
"""

from __future__ import annotations

from dit_impl.fast.options import FastOptions

#: the candidate's switches on a CUDA device
OPTIONS = FastOptions(dtype="bfloat16", sdpa="auto", fused_qkv=True, batched_conditioning=True,
                      gelu_epilogue=False, adaln="torch", compile="off", cuda_graphs=False)


def options_for(device_type: str) -> FastOptions:
    """``OPTIONS`` on CUDA; on the CPU float32 and no CUDA-only switch (graphs, GELU epilogue, kernels, quack)."""
    if device_type == "cuda":
        return OPTIONS
    return OPTIONS.replace(dtype="float32", cuda_graphs=False, gelu_epilogue=False, adaln="torch",
                           compile="off", sdpa="math", gemm="cublas")
