"""What the judge times on the DiT lane (``[tool.ditgate.lanes.dit] timing`` in pyproject.toml): the candidate's
transformer forward, and its whole sampling with its own sampler (``SAMPLER``), against the frozen diffusers
baseline's forward and the baseline's sampling loop, on inputs the judge seeds each round.

- ``tiny``: the tiny configuration in float32 on the CPU, batch 16, on a machine where the XL regions cannot run
  (no CUDA GPU, or one without 20 GB and bf16). Where they can, the lane's speed is the GPU's: a CPU region there
  would enter the objective's geometric mean as a ratio near 1 with the noise of a host region, halving the log
  of a GPU speedup, and would lengthen every judged run;
- ``xl``: DiT-XL/2 in bf16 on a GPU, batch 16 (8 images with CFG), 256 tokens, as the lane's quality tests run it;
- ``tiny-sampling`` and ``xl-sampling``: a whole sampling of the lane's timed cases (``tiny-ddim-8``,
  ``xl-ddim-10``: their steps, scheduler and guidance) with class labels and a noise seed drawn each call, to the
  final latents (no VAE); ``tiny-sampling`` where ``tiny`` runs. An approximate candidate gains here, not in a
  forward.

Audits: a numerical candidate's outputs must match the baseline's (float32 on the CPU: 1e-3; bf16 XL: 0.1). A
quantized forward is held to a looser bound (the tiny forward's fp8 GEMMs err by rel-L2 0.014, int8 weights by
0.0026: 0.05 on the CPU; 0.25 for XL, unmeasured on a GPU yet). An approximate or quantized sampling differs from
the baseline's by design (fewer steps of a random-weight model land anywhere: 2 of 8 steps is rel-L2 0.93 from 8,
a fresh noise 1.0): it is audited against a fresh process of the candidate's own tree instead
(``audit_by_class``), which finds replayed, skipped and stateful calls but not a shortcut the code takes on some
inputs every time; its quality is the lane's tests' to judge.

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


def _candidate_sampler() -> Any:
    """The candidate tree's ``SAMPLER`` (the baseline's loop where it has none)."""
    from dit_impl.fast import candidate
    from dit_impl.fast.sampler import SamplerOptions

    return getattr(candidate, "SAMPLER", None) or SamplerOptions()


def _case(name: str) -> Any:
    from dit_impl.corpus import load_corpus

    return next(case for case in load_corpus() if case.name == name)


def _sampling_builder(name: str, dtype: str, device: str, case_name: str) -> Callable[[str], Callable[..., Any]]:
    def build(impl: str) -> Callable[..., Any]:
        import torch

        case = _case(case_name)
        baseline = _model(name, dtype, device)
        settings = dict(steps=case.steps, guidance_scale=case.guidance_scale, scheduler=case.scheduler,
                        decode=False)
        if impl == "baseline":
            from dit_impl.baseline import sample as run_sample

            model, extra = baseline, {}
        else:
            from dit_impl.fast.candidate import options_for
            from dit_impl.fast.sampler import sample as run_sample
            from dit_impl.fast.sampling import fast_model

            model, extra = fast_model(baseline, options_for(device)), {"options": _candidate_sampler()}

        def run(labels: Any, seed: Any) -> Any:
            with torch.no_grad():
                return run_sample(model, [int(v) for v in labels.tolist()], seed=int(seed), **settings,
                                  **extra).latents

        return run

    return build


def _sampling_inputs(name: str, case_name: str) -> Callable[[Any], tuple]:
    def make_inputs(generator: Any) -> tuple:
        import torch

        from dit_impl.baseline.configs import get_config

        labels = torch.randint(0, get_config(name).num_classes, (len(_case(case_name).labels),),
                               generator=generator, device=generator.device)
        seed = torch.randint(0, 2**31 - 1, (1,), generator=generator, device=generator.device)
        return labels.cpu(), int(seed.item())

    return make_inputs


#: the classes whose outputs differ from the baseline's by design, audited against a fresh candidate process
_BY_DESIGN = {"approximate": None, "quantization": None}


def _xl_skip() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    props = torch.cuda.get_device_properties(0)
    if props.total_memory < 20 * 2**30 or not torch.cuda.is_bf16_supported():
        return f"needs 20 GB of device memory and bf16 ({props.name})"
    return None


def _tiny_skip() -> str | None:
    """The CPU regions run only where the XL regions cannot (see the module's docstring)."""
    if _xl_skip() is None:
        return "timed where the XL regions cannot run: on this GPU the lane's speed is the XL regions'"
    return None


REGIONS = [
    TimedRegion("tiny", _builder("tiny", "float32", "cpu"), _inputs("tiny", "float32"), device="cpu",
                rounds=16, max_rounds=40, audits=3, audit_rel_l2=1e-3, round_ms=60.0, skip=_tiny_skip,
                audit_by_class={"quantization": 0.05}),
    TimedRegion("xl", _builder("dit-xl-2-256", "bfloat16", "cuda"), _inputs("dit-xl-2-256", "bfloat16"),
                device="cuda", rounds=16, max_rounds=40, audits=3, audit_rel_l2=0.1, round_ms=60.0, skip=_xl_skip,
                audit_by_class={"quantization": 0.25}),
    TimedRegion("tiny-sampling", _sampling_builder("tiny", "float32", "cpu", "tiny-ddim-8"),
                _sampling_inputs("tiny", "tiny-ddim-8"), device="cpu", rounds=12, max_rounds=32, audits=2,
                audit_rel_l2=1e-3, round_ms=60.0, skip=_tiny_skip, audit_by_class=_BY_DESIGN),
    TimedRegion("xl-sampling", _sampling_builder("dit-xl-2-256", "bfloat16", "cuda", "xl-ddim-10"),
                _sampling_inputs("dit-xl-2-256", "xl-ddim-10"), device="cuda", rounds=12, max_rounds=32, audits=2,
                audit_rel_l2=0.1, round_ms=60.0, skip=_xl_skip, audit_by_class=_BY_DESIGN, self_audit_rel_l2=0.02),
]
