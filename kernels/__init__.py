"""DiT building-block kernels, compiled just in time (this repository's kernel workload).

Public API (torch imported on first use, not at ``import kernels``):

* :func:`layernorm_modulate` -- ``norm(x) * (1 + scale) + shift``
* :func:`gated_residual` -- ``x + gate * y``
* :func:`gated_residual_layernorm_modulate` -- both in one pass, returns ``(x_new, out)``
* PyTorch references of each in :mod:`kernels.reference`; the JIT core in :mod:`kernels.jit`.
"""

from __future__ import annotations

from pytest_ditgate.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "layernorm_modulate": "kernels.adaln",
    "gated_residual_layernorm_modulate": "kernels.adaln",
    "gated_residual": "kernels.residual",
    "KernelInputError": "kernels.binding",
}

__all__ = ["__version__", *_LAZY]

__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY)
