"""The candidate's own sampler (dit_impl/fast/sampler.py): bitwise the baseline's loop by default; each option
changes what the transformer is asked to run; latents of any dtype reach the VAE in its dtype."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dit_impl.baseline import load_model  # noqa: E402
from dit_impl.fast import FastOptions, fast_model  # noqa: E402
from dit_impl.fast import sample as baseline_loop  # noqa: E402
from dit_impl.fast.sampler import SamplerOptions, sample  # noqa: E402

CASE = dict(class_labels=[3, 207], seed=9, steps=6, record_steps=[0, 2], record_blocks=[0, 1])


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", seed=2)


@pytest.fixture(scope="module")
def fast(tiny):
    return fast_model(tiny, FastOptions(dtype="float32", sdpa="math"))


class Calls:
    """Wraps a transformer: the batch and timestep of every call, and how many blocks ran in each."""

    def __init__(self, inner):
        self.inner, self.calls, self.blocks = inner, [], 0
        for block in inner.transformer_blocks:
            block.register_forward_pre_hook(lambda *_: setattr(self, "blocks", self.blocks + 1))

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __call__(self, x, timestep=None, class_labels=None, **kwargs):
        self.blocks = 0
        out = self.inner(x, timestep=timestep, class_labels=class_labels, **kwargs)
        self.calls.append((x.shape[0], float(timestep[0]), self.blocks))
        return out


def watched(tiny, options=None):
    from dataclasses import replace

    model = fast_model(tiny, options or FastOptions(dtype="float32", sdpa="math"))
    calls = Calls(model.transformer)
    return replace(model, transformer=calls), calls


def test_default_options_are_bitwise_the_baseline_loop(fast) -> None:
    expected, got = baseline_loop(fast, **CASE), sample(fast, **CASE)
    want = expected.tensors()
    assert set(got.tensors()) == set(want)
    for name, tensor in got.tensors().items():
        assert torch.equal(tensor, want[name]), name
    assert got.timesteps == expected.timesteps and got.info["sampler"] == "default"


@pytest.mark.parametrize("options, steps, guided, blocks", [
    (SamplerOptions(steps=3), 3, 3, 2),
    (SamplerOptions(step_fraction=0.5), 3, 3, 2),
    (SamplerOptions(guidance_cutoff=0.5), 6, 3, 2),
    (SamplerOptions(block_cache=(1, 2, 2)), 6, 6, 1),
])
def test_each_option_changes_what_the_transformer_runs(tiny, options, steps, guided, blocks) -> None:
    model, calls = watched(tiny)
    result = sample(model, **CASE, options=options)
    assert len(calls.calls) == steps == result.info["steps"] == len(result.timesteps)
    assert sum(1 for batch, _, _ in calls.calls if batch == 4) == guided  # CFG doubles the 2 images
    assert min(n for _, _, n in calls.calls) == blocks
    assert all(n == 2 for _, _, n in calls.calls[::2])  # a block cache runs every block on its full steps
    assert result.latents.shape == (2, 4, 8, 8) and torch.isfinite(result.images).all()
    assert model.transformer.inner.block_cache is None  # the cache never outlives the sampling


def test_another_scheduler_samples_other_timesteps(tiny, fast) -> None:
    model, calls = watched(tiny)
    euler = sample(model, **CASE, options=SamplerOptions(scheduler="euler"))
    assert euler.info["scheduler"] == "euler"
    assert [t for _, t, _ in calls.calls] != [float(t) for t in sample(fast, **CASE).timesteps]


def test_recorded_steps_beyond_the_steps_taken_are_left_out(fast) -> None:
    result = sample(fast, **{**CASE, "record_steps": [0, 4, -1]}, options=SamplerOptions(steps=2))
    assert sorted(result.step_latents) == [0, 1]


def test_a_block_cache_needs_the_eager_fast_dit(tiny) -> None:
    with pytest.raises(ValueError, match="block_cache needs an eager fast DiT"):
        sample(tiny, **CASE, options=SamplerOptions(block_cache=(0, 1, 2)))
    seamed = fast_model(tiny, FastOptions(dtype="float32", sdpa="math", block_seam=True))
    with pytest.raises(ValueError, match="block_seam=False"):
        sample(seamed, **CASE, options=SamplerOptions(block_cache=(0, 1, 2)))
    with pytest.raises(ValueError, match="outside the model's 2 blocks"):
        sample(fast_model(tiny, FastOptions(dtype="float32", sdpa="math")), **CASE,
               options=SamplerOptions(block_cache=(0, 3, 2)))


def test_fp16_latents_reach_a_float32_vae_in_its_dtype(tiny) -> None:
    """The DiT lane's fp16 crash: an fp16 transformer beside the baseline's VAE of another dtype."""
    half = fast_model(tiny, FastOptions(dtype="float16", sdpa="math"))
    assert half.vae.dtype == torch.float32
    result = sample(half, **CASE)
    assert result.latents.dtype == torch.float16 and result.images.dtype == torch.float32
    assert torch.isfinite(result.images).all()


def test_the_fast_dit_takes_latents_of_any_dtype(fast) -> None:
    x = torch.randn(2, 4, 8, 8, dtype=torch.float64)
    t, y = torch.tensor([10, 10]), torch.tensor([1, 2])
    with torch.inference_mode():
        out = fast.transformer(x, timestep=t, class_labels=y).sample
        same = fast.transformer(x.float(), timestep=t, class_labels=y).sample
    assert out.dtype == torch.float32 and torch.equal(out, same)


def test_sampler_options_label_round_trip_and_validation() -> None:
    options = SamplerOptions(step_fraction=0.25, scheduler="euler", guidance_cutoff=0.5, block_cache=(2, 26, 2))
    assert options.label() == "step_fraction=0.25,scheduler=euler,guidance_cutoff=0.5,block_cache=2:26:2"
    assert SamplerOptions.parse(options.label()) == options
    assert SamplerOptions.parse("default") == SamplerOptions() and SamplerOptions().label() == "default"
    assert [SamplerOptions(step_fraction=f).steps_for(50) for f in (0.1, 0.01, 1.0)] == [5, 1, 50]
    for bad, match in [(dict(steps=0), "steps"), (dict(step_fraction=1.5), "step_fraction"),
                       (dict(steps=4, step_fraction=0.5), "not both"), (dict(scheduler="heun"), "scheduler"),
                       (dict(guidance_cutoff=2.0), "guidance_cutoff"), (dict(block_cache=(3, 2, 1)), "block_cache")]:
        with pytest.raises(ValueError, match=match):
            SamplerOptions(**bad)
    with pytest.raises(ValueError, match="bad sampler option"):
        SamplerOptions.parse("step=4")
