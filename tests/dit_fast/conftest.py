"""Shared fixtures of the fast-DiT tests: a tiny diffusers DiT with seeded random weights and its inputs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")


@pytest.fixture(scope="session")
def tiny_reference():
    """A float32 diffusers DiTTransformer2DModel of the ``tiny`` config with seeded random weights."""
    from diffusers import DiTTransformer2DModel

    from dit_impl.baseline.configs import get_config
    from dit_impl.baseline.weights import init_random_

    model = DiTTransformer2DModel(**get_config("tiny").transformer)
    init_random_(model, 11)
    return model.eval().requires_grad_(False)


@pytest.fixture(scope="session")
def tiny_inputs():
    """Latents, per-sample timesteps and labels (the null class 1000 included), as the CFG batch has."""
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(4, 4, 8, 8, generator=generator)
    return x, torch.tensor([999, 999, 500, 3]), torch.tensor([1, 1000, 207, 999])


@pytest.fixture(scope="session")
def tiny_expected(tiny_reference, tiny_inputs):
    x, t, y = tiny_inputs
    with torch.inference_mode():
        return tiny_reference(x, timestep=t, class_labels=y).sample
