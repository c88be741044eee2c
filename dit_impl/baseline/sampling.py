"""The baseline sampling loop, written like diffusers' DiTPipeline but returning what the gates compare.

Classifier-free guidance with the null class (1000 for ImageNet configs), the learned-sigma split,
scheduler steps, latent scaling and VAE decode follow DiTPipeline; a pixel-space config (no VAE)
denoises images in [-1, 1] and maps them to [0, 1]. The initial noise is drawn on the CPU from ``seed`` and then
moved, so every device and dtype starts from the same latents.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Sequence


if TYPE_CHECKING:
    import torch

    from dit_impl.baseline.weights import DitModel

#: DiT's training noise schedule (the DiT-XL/2 release uses these betas)
_SCHEDULE = dict(num_train_timesteps=1000, beta_start=0.0001, beta_end=0.02, beta_schedule="linear")
#: scheduler name -> (diffusers class name, extra config)
SCHEDULERS: dict[str, tuple[str, dict[str, Any]]] = {
    "ddim": ("DDIMScheduler", dict(clip_sample=False, set_alpha_to_one=True, steps_offset=0)),
    "dpm-multistep": ("DPMSolverMultistepScheduler", dict(algorithm_type="dpmsolver++", solver_order=2)),
    "euler": ("EulerDiscreteScheduler", dict()),
}


def make_scheduler(name: str) -> Any:
    """A fresh diffusers scheduler by corpus name (``ddim``, ``dpm-multistep``, ``euler``)."""
    import diffusers

    try:
        class_name, extra = SCHEDULERS[name]
    except KeyError:
        raise ValueError(f"unknown scheduler {name!r}; known: {', '.join(SCHEDULERS)}") from None
    return getattr(diffusers, class_name)(**_SCHEDULE, prediction_type="epsilon", **extra)


@dataclass
class SampleResult:
    """Outputs of one sampling run (conditional half only where CFG doubles the batch)."""

    latents: "torch.Tensor"  # final latents, before 1/scaling_factor, (B, C, h, w)
    step_latents: dict[int, "torch.Tensor"]  # step index -> latents after that step
    images: "torch.Tensor | None"  # decoded, in [0, 1], (B, 3, H, W)
    activations: dict[str, "torch.Tensor"]  # "block{i}.step{s}" -> block output hidden states (B, tokens, hidden)
    timesteps: list[int]
    info: dict[str, Any] = field(default_factory=dict)

    def tensors(self, *, activation_images: int | None = None, activation_tokens: int | None = None
                ) -> dict[str, "torch.Tensor"]:
        """Flat name -> tensor dict (``latents``, ``step{s}.latents``, ``images``, ``block{i}.step{s}``).

        ``activation_images`` / ``activation_tokens`` keep only the first images / tokens of each
        activation (XL/2 activations are 1.2 MB per image and block in float32: goldens stay small).
        """
        out: dict[str, Any] = {"latents": self.latents}
        out.update({f"step{s}.latents": t for s, t in sorted(self.step_latents.items())})
        if self.images is not None:
            out["images"] = self.images
        for name, act in sorted(self.activations.items()):
            out[name] = act[:activation_images, :activation_tokens].contiguous()
        return out


def _normalise_steps(steps: Iterable[int], count: int) -> set[int]:
    chosen = set()
    for step in steps:
        index = step + count if step < 0 else step
        if not 0 <= index < count:
            raise ValueError(f"step {step} is outside 0..{count - 1}")
        chosen.add(index)
    return chosen


def _check_labels(labels: Sequence[int], num_classes: int) -> None:
    bad = [label for label in labels if not 0 <= int(label) < num_classes]
    if not labels or bad:
        raise ValueError(f"class labels must be a non-empty list of ints in 0..{num_classes - 1}; bad: {bad or labels}")


def start_latents(model: "DitModel", class_labels: Sequence[int], *, seed: int, steps: int, guidance_scale: float,
                  scheduler: str) -> tuple[Any, "torch.Tensor", "torch.Tensor"]:
    """What every sampling loop starts from: the scheduler set to ``steps``, the first latents from ``seed`` (drawn
    on the CPU, so every device and dtype starts alike; doubled for CFG) and the labels (the null class appended
    for CFG)."""
    import torch

    cfg, device, dtype = model.config, model.device, model.dtype
    noise = torch.randn((len(class_labels), cfg.latent_channels, cfg.latent_size, cfg.latent_size),
                        generator=torch.Generator("cpu").manual_seed(seed), dtype=torch.float32)
    sched = make_scheduler(scheduler)
    sched.set_timesteps(steps)
    latents = (noise * sched.init_noise_sigma).to(device=device, dtype=dtype)
    use_cfg = guidance_scale > 1
    latent_input = torch.cat([latents] * 2) if use_cfg else latents
    labels = torch.tensor(list(class_labels), device=device, dtype=torch.long)
    if use_cfg:
        labels = torch.cat([labels, torch.full_like(labels, cfg.null_class)])
    return sched, latent_input, labels


def guided(noise_pred: "torch.Tensor", channels: int, guidance_scale: float) -> "torch.Tensor":
    """Classifier-free guidance on a doubled batch: both halves get the guided noise; the channels past
    ``channels`` (a learned sigma) are kept as predicted."""
    import torch

    eps, rest = noise_pred[:, :channels], noise_pred[:, channels:]
    cond_eps, uncond_eps = torch.split(eps, len(eps) // 2, dim=0)
    half_eps = uncond_eps + guidance_scale * (cond_eps - uncond_eps)
    return torch.cat([torch.cat([half_eps, half_eps], dim=0), rest], dim=1)


def scheduler_input(noise_pred: "torch.Tensor", channels: int, learned_sigma: bool) -> "torch.Tensor":
    """What the scheduler steps with: the noise prediction without a learned sigma's channels."""
    import torch

    return torch.split(noise_pred, channels, dim=1)[0] if learned_sigma else noise_pred


class BlockRecorder:
    """Forward hooks that keep chosen blocks' outputs (the conditional half of the batch) at chosen steps, as
    ``activations["block{i}.step{s}"]``; the loop sets :attr:`step` before each step's forward."""

    def __init__(self, transformer: Any, blocks: Iterable[int], steps: set[int], batch: int) -> None:
        self.blocks = sorted(set(blocks))
        for block in self.blocks:
            if not 0 <= block < len(transformer.transformer_blocks):
                raise ValueError(f"block {block} is outside 0..{len(transformer.transformer_blocks) - 1}")
        self.transformer, self.steps, self.batch = transformer, steps, batch
        self.activations: dict[str, "torch.Tensor"] = {}
        self.step = -1
        self._handles: list[Any] = []

    def _hook_for(self, block: int) -> Any:
        def hook(_module: Any, _args: Any, output: Any) -> None:
            if self.step in self.steps:
                hidden = output[0] if isinstance(output, tuple) else output
                self.activations[f"block{block}.step{self.step}"] = hidden[:self.batch].detach().clone()
        return hook

    def __enter__(self) -> "BlockRecorder":
        self._handles = [self.transformer.transformer_blocks[b].register_forward_hook(self._hook_for(b))
                         for b in self.blocks]
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def sample(model: "DitModel", class_labels: Sequence[int], *, seed: int, steps: int, guidance_scale: float = 4.0,
           scheduler: str = "ddim", record_steps: Iterable[int] = (), record_blocks: Iterable[int] = (),
           record_block_steps: Iterable[int] = (0,), decode: bool = True) -> SampleResult:
    """Run DiT sampling; record latents after ``record_steps`` and block outputs at ``record_block_steps``."""
    import torch

    transformer, vae, cfg = model.transformer, model.vae, model.config
    _check_labels(class_labels, cfg.num_classes)
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    device, dtype = model.device, model.dtype
    batch, channels = len(class_labels), cfg.latent_channels
    use_cfg = guidance_scale > 1
    keep_steps = _normalise_steps(record_steps, steps)
    recorder = BlockRecorder(transformer, record_blocks, _normalise_steps(record_block_steps, steps), batch)
    sched, latent_input, labels = start_latents(model, class_labels, seed=seed, steps=steps,
                                                guidance_scale=guidance_scale, scheduler=scheduler)
    step_latents: dict[int, torch.Tensor] = {}
    with recorder, torch.inference_mode():
        for index, t in enumerate(sched.timesteps):
            recorder.step = index
            if use_cfg:
                half = latent_input[: len(latent_input) // 2]
                latent_input = torch.cat([half, half], dim=0)
            model_in = sched.scale_model_input(latent_input, t)
            timesteps = t.reshape(1).to(device).expand(model_in.shape[0])
            noise_pred = transformer(model_in, timestep=timesteps, class_labels=labels).sample
            if use_cfg:
                noise_pred = guided(noise_pred, channels, guidance_scale)
            latent_input = sched.step(scheduler_input(noise_pred, channels, cfg.learned_sigma), t,
                                      latent_input).prev_sample
            if index in keep_steps:
                step_latents[index] = latent_input[:batch].clone()
        final = latent_input[:batch]
        images = None
        if decode:
            decoded = final if vae is None else vae.decode(final / vae.config.scaling_factor).sample
            images = (decoded / 2 + 0.5).clamp(0, 1)
    activations = recorder.activations
    info = dict(config=cfg.name, seed=seed, steps=steps, guidance_scale=guidance_scale, scheduler=scheduler,
                class_labels=list(class_labels), dtype=str(dtype).replace("torch.", ""), device=str(device),
                weights=model.source, implementation=model.implementation)
    return SampleResult(latents=final.clone(), step_latents=step_latents, images=images, activations=activations,
                        timesteps=[int(t) for t in sched.timesteps], info=info)
