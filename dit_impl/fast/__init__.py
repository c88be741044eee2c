"""The fast DiT: diffusers' DiT-XL/2 function with switchable optimisations, judged against the baseline.

Public names (torch is imported on first use, not with this package): :class:`FastOptions`,
:class:`FastDiT`, :func:`from_diffusers`, :func:`from_pretrained`, :func:`load_diffusers_state_dict`,
:class:`GraphedDiT`, :func:`fast_transformer`, :func:`fast_model`, :func:`sample`.
"""

from __future__ import annotations

from pytest_ditgate.lazy import lazy_exports

_LAZY = {
    "FastOptions": "dit_impl.fast.options",
    "FastDiT": "dit_impl.fast.model",
    "DitShape": "dit_impl.fast.model",
    "from_diffusers": "dit_impl.fast.weights",
    "from_pretrained": "dit_impl.fast.weights",
    "load_diffusers_state_dict": "dit_impl.fast.weights",
    "FastWeightsError": "dit_impl.fast.weights",
    "GraphedDiT": "dit_impl.fast.graphs",
    "AttentionFallback": "dit_impl.fast.attention",
    "fast_transformer": "dit_impl.fast.sampling",
    "fast_model": "dit_impl.fast.sampling",
    "sample": "dit_impl.fast.sampling",
}

__all__ = list(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY)
