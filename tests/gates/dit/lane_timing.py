"""What the judge times on the DiT lane (``[tool.ditgate.lanes.dit] timing`` in pyproject.toml): the candidate's
transformer forward against the frozen diffusers baseline's, on inputs the judge seeds each round.

- ``tiny``: the tiny configuration in float32 on the CPU, batch 16 (every machine);
- ``xl``: DiT-XL/2 in bf16 on a GPU, batch 16 (8 images with CFG), 256 tokens, as the lane's quality tests run it.

The judge builds ``candidate`` in the candidate's tree and the lane best's candidate and the ``baseline`` in a
read-only checkout of the best's commit (docs/agent_loop.md, "How the judge times"). A fixed path: nothing here is
the candidate's to change. Everything is imported inside the functions: the judge reads ``REGIONS`` without
importing the project's code.
"""

from __future__ import annotations

from typing import Any, Callable

from pytest_ditgate.timed_region import TimedRegion

#: the weights of both models, as the lane's tests build them (dit_gate_support.WEIGHTS_SEED)
WEIGHTS_SEED = 0
BATCH = 16


def _model(name: str, dtype: str, device: str) -> Any:
    from dit_impl.baseline import load_model

    return load_model(name, seed=WEIGHTS_SEED, dtype=dtype, device=device)


def _forward(transformer: Any) -> Callable[..., Any]:
    import torch

    def run(x: Any, t: Any, y: Any) -> Any:
        with torch.no_grad():
            return transformer(x, timestep=t, class_labels=y).sample

    return run


def _builder(name: str, dtype: str, device: str) -> Callable[[str], Callable[..., Any]]:
    def build(impl: str) -> Callable[..., Any]:
        baseline = _model(name, dtype, device)
        if impl == "baseline":
            return _forward(baseline.transformer)
        from dit_impl.fast.candidate import options_for
        from dit_impl.fast.sampling import fast_model

        return _forward(fast_model(baseline, options_for(device)).transformer)

    return build


def _inputs(name: str, dtype: str) -> Callable[[Any], tuple]:
    def make_inputs(generator: Any) -> tuple:
        import torch

        from dit_impl.baseline.configs import get_config

        config = get_config(name)
        device = generator.device
        size = (BATCH, config.latent_channels, config.latent_size, config.latent_size)
        x = torch.randn(size, generator=generator, device=device).to(getattr(torch, dtype))
        t = torch.randint(0, 1000, (BATCH,), generator=generator, device=device)
        y = torch.randint(0, 1000, (BATCH,), generator=generator, device=device)
        return x, t, y

    return make_inputs


def _xl_skip() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    props = torch.cuda.get_device_properties(0)
    if props.total_memory < 20 * 2**30 or not torch.cuda.is_bf16_supported():
        return f"needs 20 GB of device memory and bf16 ({props.name})"
    return None


REGIONS = [
    TimedRegion("tiny", _builder("tiny", "float32", "cpu"), _inputs("tiny", "float32"), device="cpu",
                rounds=16, max_rounds=40, audits=3, audit_rel_l2=1e-3, round_ms=60.0),
    TimedRegion("xl", _builder("dit-xl-2-256", "bfloat16", "cuda"), _inputs("dit-xl-2-256", "bfloat16"),
                device="cuda", rounds=16, max_rounds=40, audits=3, audit_rel_l2=0.1, round_ms=60.0, skip=_xl_skip),
]
