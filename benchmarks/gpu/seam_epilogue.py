"""The DiT block's gated residual as a quack GEMM epilogue, for ``quack_seam_probe.py``.

A module of its own, bound to a module-level name: quack keys its compiled kernels by the function's source
and re-imports the epilogue by module and name in its compile workers, which a script's ``__main__`` cannot
offer (the probe puts this folder on ``PYTHONPATH`` for them).
"""

from quack.epilogue.frontend import gemm_epilogue


@gemm_epilogue()
def gated_residual(acc, c, bias, gate):
    """Per accumulator element: ``c`` is the residual stream [l, m, N]; ``bias`` and ``gate`` are [l, N] rows
    (the 16 images as the batch ``l``), so the result is ``x + gate[image] * (a @ W + bias)``."""
    return {"D": c + gate * (acc + bias)}
