"""Full sampling through the baseline's loop with the fast transformer gives the baseline's latents."""

from __future__ import annotations

import pytest

from pytest_ditgate.quality.metrics import rel_l2

torch = pytest.importorskip("torch")

from dit_impl.baseline import load_model, sample  # noqa: E402
from dit_impl.fast import FastOptions, GraphedDiT, fast_model  # noqa: E402
from dit_impl.fast import sample as fast_sample  # noqa: E402


@pytest.mark.parametrize("switches", ["", "block_seam=1"])
def test_fast_sampling_matches_baseline_latents_and_images(switches) -> None:
    """Latents, images and recorded block outputs (a seamed block returns its output first) match."""
    baseline = load_model("tiny", seed=2)
    args = dict(class_labels=[3, 207], seed=9, steps=2, record_steps=[0], record_blocks=[0, 1])
    expected = sample(baseline, **args)
    options = FastOptions.parse(switches, FastOptions(dtype="float32"))
    fast = fast_model(baseline, options)
    got = fast_sample(fast, **args)
    assert fast.implementation == f"fast({options.label()})" and fast.source == baseline.source
    # a golden frozen from the baseline is this run's baseline too: the same weights, another implementation
    assert got.info["weights"] == expected.info["weights"] == "random(seed=2)"
    assert (expected.info["implementation"], got.info["implementation"]) == ("baseline", fast.implementation)
    got_tensors = got.tensors()
    for name, tensor in expected.tensors().items():
        assert rel_l2(got_tensors[name], tensor) < 1e-5, name


def test_graphs_need_cuda() -> None:
    baseline = load_model("tiny", seed=2)
    with pytest.raises(ValueError, match="CUDA graphs need a model on CUDA"):
        fast_model(baseline, FastOptions(dtype="float32", cuda_graphs=True))
    with pytest.raises(ValueError, match="CUDA"):
        GraphedDiT(fast_model(baseline, FastOptions(dtype="float32")).transformer)
