"""The frozen baseline: class-conditional DiT sampling with classifier-free guidance on diffusers.

Public names: :data:`CONFIGS` / :func:`get_config` (named shapes), :func:`load_model` (local weights or
seeded random init), :func:`save_model`, :func:`sample` -> :class:`SampleResult`. Torch and diffusers
are imported on first use, not when this package is imported.
"""

from __future__ import annotations

from pytest_ditgate.lazy import lazy_exports

_LAZY = {
    "CONFIGS": "dit_impl.baseline.configs",
    "DitConfig": "dit_impl.baseline.configs",
    "get_config": "dit_impl.baseline.configs",
    "DitModel": "dit_impl.baseline.weights",
    "load_model": "dit_impl.baseline.weights",
    "save_model": "dit_impl.baseline.weights",
    "WeightsError": "dit_impl.baseline.weights",
    "SampleResult": "dit_impl.baseline.sampling",
    "sample": "dit_impl.baseline.sampling",
    "make_scheduler": "dit_impl.baseline.sampling",
    "SCHEDULERS": "dit_impl.baseline.sampling",
}

__all__ = list(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY)
