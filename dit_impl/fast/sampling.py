"""Full sampling with the fast transformer: the baseline's own loop, so the arithmetic is identical.

``dit_impl.baseline.sample`` calls ``model.transformer(x, timestep=, class_labels=).sample`` and reads
``dtype``/``device``; ``FastDiT`` and ``GraphedDiT`` provide exactly that, so the baseline loop (CFG
with the null class, learned-sigma split, scheduler, VAE decode) runs unchanged around them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from dit_impl.fast.options import FastOptions

if TYPE_CHECKING:
    from dit_impl.baseline.sampling import SampleResult
    from dit_impl.baseline.weights import DitModel


def fast_transformer(model: Any, options: FastOptions | None = None, *, device: Any = None) -> Any:
    """A ``FastDiT`` (wrapped in ``GraphedDiT`` when ``options.cuda_graphs``) with ``model``'s weights.

    ``model`` is a diffusers ``DiTTransformer2DModel`` or a local diffusers folder path.
    """
    from pathlib import Path

    from dit_impl.fast.graphs import GraphedDiT
    from dit_impl.fast.weights import from_diffusers, from_pretrained

    options = options or FastOptions()
    if isinstance(model, (str, Path)):
        fast = from_pretrained(model, options, device=device or "cpu")
    else:
        fast = from_diffusers(model, options, device=device)
    return GraphedDiT(fast) if options.cuda_graphs else fast


def fast_model(baseline: "DitModel", options: FastOptions | None = None) -> "DitModel":
    """The baseline ``DitModel`` with its transformer replaced by the fast one (same VAE, same config)."""
    from dit_impl.baseline.weights import DitModel

    options = options or FastOptions()
    transformer = fast_transformer(baseline.transformer, options)
    return DitModel(baseline.config, transformer, baseline.vae, source=baseline.source,
                    implementation=f"fast({options.label()})")


def sample(model: "DitModel", class_labels: Sequence[int], **kwargs: Any) -> "SampleResult":
    """``dit_impl.baseline.sample`` on a model from ``fast_model``; block recording needs eager blocks."""
    from dit_impl.baseline.sampling import sample as baseline_sample
    from dit_impl.fast.graphs import GraphedDiT

    if kwargs.get("record_blocks") and isinstance(model.transformer, GraphedDiT):
        raise ValueError("record_blocks needs forward hooks, which a CUDA graph replay does not run; "
                         "use cuda_graphs=False to record block outputs")
    return baseline_sample(model, class_labels, **kwargs)
