"""The candidate's own sampling loop: the baseline's arithmetic by default, approximations on request.

``sample(model, class_labels, ..., options=SamplerOptions(...))`` takes the same arguments as
``dit_impl.baseline.sample`` (a corpus case's frozen settings) plus the candidate's :class:`SamplerOptions`. With
the default options it runs the baseline's loop op for op, so its result is bitwise the baseline's (a test
checks it); each option is an ``approximate`` change of the sampling:

* ``steps`` / ``step_fraction``: another number of denoising steps (a fixed count, or a fraction of the case's);
* ``scheduler``: another scheduler (``ddim``, ``dpm-multistep``, ``euler``);
* ``guidance_cutoff``: classifier-free guidance for the first fraction of the steps only; the rest call the
  transformer on the conditional half alone (half the batch);
* ``block_cache``: ``(first, last, every)``: blocks ``first`` .. ``last - 1`` run on every ``every``-th step
  and add what they added then on the steps between (the fast DiT's :class:`~dit_impl.fast.model.BlockCache`).

The loop is the candidate's code (a mutable path), so it repeats the baseline's (a fixed path) rather than
calling it. Latents of any dtype reach the VAE in the VAE's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Iterable, Sequence

if TYPE_CHECKING:
    from dit_impl.baseline.sampling import SampleResult
    from dit_impl.baseline.weights import DitModel


@dataclass(frozen=True)
class SamplerOptions:
    """How the candidate samples; every default keeps the case's own setting (bitwise the baseline)."""

    #: denoising steps for every case (None: the case's)
    steps: int | None = None
    #: or this fraction of the case's steps, rounded, at least one (None: the case's)
    step_fraction: float | None = None
    #: another scheduler (None: the case's)
    scheduler: str | None = None
    #: guidance on the first ``guidance_cutoff`` fraction of the steps only (None: every step)
    guidance_cutoff: float | None = None
    #: (first, last, every): blocks first..last-1 run every ``every``-th step, reused in between (None: off)
    block_cache: tuple[int, int, int] | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the field whose value cannot work."""
        from dit_impl.baseline.sampling import SCHEDULERS

        if self.steps is not None and (not isinstance(self.steps, int) or self.steps < 1):
            raise ValueError(f"SamplerOptions.steps={self.steps!r} must be an int >= 1")
        if self.step_fraction is not None and not 0 < self.step_fraction <= 1:
            raise ValueError(f"SamplerOptions.step_fraction={self.step_fraction!r} must be in (0, 1]")
        if self.steps is not None and self.step_fraction is not None:
            raise ValueError("SamplerOptions: give steps or step_fraction, not both")
        if self.scheduler is not None and self.scheduler not in SCHEDULERS:
            raise ValueError(f"SamplerOptions.scheduler={self.scheduler!r} is not one of {', '.join(SCHEDULERS)}")
        if self.guidance_cutoff is not None and not 0 <= self.guidance_cutoff <= 1:
            raise ValueError(f"SamplerOptions.guidance_cutoff={self.guidance_cutoff!r} must be in [0, 1]")
        if self.block_cache is not None:
            cache = tuple(self.block_cache)
            if len(cache) != 3 or not all(isinstance(v, int) for v in cache) or not (
                    0 <= cache[0] < cache[1] and cache[2] >= 1):
                raise ValueError(f"SamplerOptions.block_cache={self.block_cache!r} must be (first, last, every) with "
                                 "0 <= first < last and every >= 1")

    def steps_for(self, case_steps: int) -> int:
        """The number of steps this sampler takes for a case of ``case_steps``."""
        if self.steps is not None:
            return self.steps
        if self.step_fraction is not None:
            return max(1, round(case_steps * self.step_fraction))
        return case_steps

    def replace(self, **changes: Any) -> "SamplerOptions":
        return replace(self, **changes)

    def label(self) -> str:
        """The fields that differ from the defaults (``default`` if none); :meth:`parse` reads it back."""
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value != f.default:
                parts.append(f"{f.name}={':'.join(map(str, value)) if isinstance(value, tuple) else value}")
        return ",".join(parts) or "default"

    @classmethod
    def parse(cls, text: str) -> "SamplerOptions":
        """Options from a :meth:`label` (``steps=4,block_cache=2:26:2``)."""
        changes: dict[str, Any] = {}
        kinds = {"steps": int, "step_fraction": float, "scheduler": str, "guidance_cutoff": float}
        for item in filter(None, (part.strip() for part in text.split(","))):
            if item == "default":
                continue
            key, sep, value = item.partition("=")
            if not sep or key not in (*kinds, "block_cache"):
                raise ValueError(f"bad sampler option {item!r} in {text!r}; fields: {', '.join(kinds)}, block_cache")
            changes[key] = (tuple(int(v) for v in value.split(":")) if key == "block_cache" else kinds[key](value))
        return cls(**changes)


def _in_range(steps: Iterable[int], count: int) -> set[int]:
    """Recorded step indices that exist in a run of ``count`` steps (negative ones count from the end)."""
    return {s + count if s < 0 else s for s in steps if -count <= s < count}


def sample(model: "DitModel", class_labels: Sequence[int], *, seed: int, steps: int, guidance_scale: float = 4.0,
           scheduler: str = "ddim", record_steps: Iterable[int] = (), record_blocks: Iterable[int] = (),
           record_block_steps: Iterable[int] = (0,), decode: bool = True,
           options: SamplerOptions | None = None) -> "SampleResult":
    """Sample a case (its frozen ``steps``, ``scheduler``, ``guidance_scale``, seed) as ``options`` say.

    ``record_steps`` and ``record_block_steps`` outside the steps actually taken are not recorded."""
    import torch

    from dit_impl.baseline.sampling import (BlockRecorder, SampleResult, _check_labels, guided, scheduler_input,
                                            start_latents)
    from dit_impl.fast.model import BlockCache

    options = options or SamplerOptions()
    transformer, vae, cfg = model.transformer, model.vae, model.config
    _check_labels(class_labels, cfg.num_classes)
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    taken = options.steps_for(steps)
    scheduler = options.scheduler or scheduler
    device, dtype = model.device, model.dtype
    batch, channels = len(class_labels), cfg.latent_channels
    use_cfg = guidance_scale > 1
    guided_steps = taken if options.guidance_cutoff is None or not use_cfg else round(taken * options.guidance_cutoff)
    keep_steps = _in_range(record_steps, taken)
    recorder = BlockRecorder(transformer, record_blocks, _in_range(record_block_steps, taken), batch)
    cache = None
    if options.block_cache is not None:
        first, last, every = options.block_cache
        cache = BlockCache(first, last)
        if not callable(getattr(transformer, "use_block_cache", None)):
            raise ValueError(f"block_cache needs an eager fast DiT (FastDiT.use_block_cache); the transformer is a "
                             f"{type(transformer).__name__} (a CUDA graph replays every block)")
        transformer.use_block_cache(cache)

    sched, latent_input, labels = start_latents(model, class_labels, seed=seed, steps=taken,
                                                guidance_scale=guidance_scale, scheduler=scheduler)
    step_latents: dict[int, torch.Tensor] = {}
    try:
        with recorder, torch.inference_mode():
            for index, t in enumerate(sched.timesteps):
                recorder.step = index
                if cache is not None:
                    cache.reuse = index % options.block_cache[2] != 0
                guiding = use_cfg and index < guided_steps
                if use_cfg:
                    half = latent_input[: len(latent_input) // 2]
                    latent_input = torch.cat([half, half], dim=0)
                model_in = sched.scale_model_input(latent_input, t)
                if use_cfg and not guiding:  # the conditional half alone; the scheduler keeps the doubled batch
                    model_in, call_labels = model_in[:batch], labels[:batch]
                else:
                    call_labels = labels
                timesteps = t.reshape(1).to(device).expand(model_in.shape[0])
                noise_pred = transformer(model_in, timestep=timesteps, class_labels=call_labels).sample
                if guiding:
                    noise_pred = guided(noise_pred, channels, guidance_scale)
                elif use_cfg:
                    noise_pred = torch.cat([noise_pred, noise_pred], dim=0)
                latent_input = sched.step(scheduler_input(noise_pred, channels, cfg.learned_sigma), t,
                                          latent_input).prev_sample
                if index in keep_steps:
                    step_latents[index] = latent_input[:batch].clone()
            final = latent_input[:batch]
            images = None
            if decode:
                decoded = final if vae is None else vae.decode(final.to(vae.dtype) / vae.config.scaling_factor).sample
                images = (decoded / 2 + 0.5).clamp(0, 1)
    finally:
        if cache is not None:
            transformer.use_block_cache(None)
    activations = recorder.activations
    info = dict(config=cfg.name, seed=seed, steps=taken, guidance_scale=guidance_scale, scheduler=scheduler,
                class_labels=list(class_labels), dtype=str(dtype).replace("torch.", ""), device=str(device),
                weights=model.source, implementation=model.implementation, sampler=options.label(),
                guided_steps=guided_steps if use_cfg else 0)
    return SampleResult(latents=final.clone(), step_latents=step_latents, images=images, activations=activations,
                        timesteps=[int(t) for t in sched.timesteps], info=info)
