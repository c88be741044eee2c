"""Training of the shapes classifier and the shapes DiT on images drawn on the fly from the family.

Data streams are seeded from one data seed (classifier: seed, DiT: seed + 1, held-out accuracy: seed + 2,
Frechet reference: seed + 3), so a manifest's data seed says which images each stage saw. The DiT learns
epsilon prediction on DiT's linear beta schedule (the one the baseline samplers use), with 10 % of the
labels dropped to the null class for classifier-free guidance, in bf16 autocast with an EMA of the weights.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from dit_impl.shapes.family import NUM_CLASSES, render

if TYPE_CHECKING:
    import torch

#: DiT's training schedule, the same betas as dit_impl.baseline.sampling's schedulers
TRAIN_STEPS, BETA_START, BETA_END = 1000, 1e-4, 0.02
LABEL_DROP = 0.1
#: the DiT's step time is measured over these steps (after the warm-up) to fit the time budget
TIMED_FROM, TIMED_TO = 20, 60
REFERENCE_IMAGES = 10_000


@dataclass
class StageLog:
    """What one training stage did: steps, seconds, losses and evaluation numbers (for the manifest)."""

    steps: int = 0
    seconds: float = 0.0
    numbers: dict[str, Any] = field(default_factory=dict)


def _lr(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _batch(generator: "torch.Generator", size: int) -> tuple["torch.Tensor", "torch.Tensor"]:
    import torch

    labels = torch.randint(0, NUM_CLASSES, (size,), generator=generator, device=generator.device)
    return labels, render(labels, generator)


def train_classifier(device: str, seed: int, *, steps: int, batch: int, reference_images: int = REFERENCE_IMAGES,
                     held_out: int = 5000, log: Callable[[str], None] = print) -> tuple["torch.nn.Module", StageLog]:
    """Train the classifier (noise, contrast and blur augmentation, so imperfect samples are still read)."""
    import torch
    import torch.nn.functional as F

    from dit_impl.shapes.classifier import ShapesClassifier

    torch.manual_seed(seed)
    model = ShapesClassifier().to(device)
    optimiser = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    generator = torch.Generator(device=device).manual_seed(seed)
    stage, start = StageLog(), time.perf_counter()
    for step in range(steps):
        for group in optimiser.param_groups:
            group["lr"] = _lr(step, steps, 2e-3, 100)
        labels, images = _batch(generator, batch)
        sigma = 0.08 * torch.rand(batch, 1, 1, 1, generator=generator, device=device)
        gain = 0.8 + 0.4 * torch.rand(batch, 1, 1, 1, generator=generator, device=device)
        blurred = F.avg_pool2d(F.pad(images, (1, 1, 1, 1), mode="replicate"), 3, stride=1)
        soft = torch.rand(batch, 1, 1, 1, generator=generator, device=device) < 0.3
        images = torch.where(soft, blurred, images)
        noisy = ((images - 0.5) * gain + 0.5 + sigma * torch.randn(images.shape, generator=generator, device=device))
        loss = F.cross_entropy(model(noisy.clamp(0, 1)), labels)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        if step % 250 == 0 or step == steps - 1:
            log(f"classifier step {step} loss {loss.item():.4f}")
    model.eval().requires_grad_(False)
    stage.steps, stage.seconds = steps, time.perf_counter() - start
    stage.numbers["final_loss"] = float(loss.item())
    stage.numbers["held_out_accuracy"] = held_out_accuracy(model, device, seed + 2, held_out)
    stage.numbers["held_out_images"] = held_out
    mu, sigma = reference_statistics(model, device, seed + 3, reference_images)
    model.reference_mu.copy_(mu)
    model.reference_sigma.copy_(sigma)
    stage.numbers["reference"] = {"images": reference_images, "seed": seed + 3}
    log(f"classifier: held-out accuracy {stage.numbers['held_out_accuracy']:.4f} in {stage.seconds:.1f} s")
    return model, stage


def held_out_accuracy(model: "torch.nn.Module", device: str, seed: int, count: int = 5000) -> float:
    import torch

    from dit_impl.shapes.family import real_images

    labels, images = real_images(count, seed, device=device)
    with torch.no_grad():
        predicted = torch.cat([model(chunk).argmax(dim=1) for chunk in images.split(500)])
    return float((predicted == labels).float().mean())


def reference_statistics(model: "torch.nn.Module", device: str, seed: int, count: int = REFERENCE_IMAGES
                         ) -> tuple["torch.Tensor", "torch.Tensor"]:
    """Feature mean and covariance of ``count`` real images from ``seed`` (the Frechet reference)."""
    import torch

    from dit_impl.shapes.family import real_images
    from pytest_ditgate.quality.learned import feature_statistics

    _, images = real_images(count, seed, device=device)
    with torch.no_grad():
        return feature_statistics(torch.cat([model.features(chunk) for chunk in images.split(500)]))


def _snapshot(*modules: Any) -> list[dict[str, Any]]:
    """Copies of the state of ``modules`` (models and the optimiser), to roll back to after a divergence."""
    return [copy.deepcopy(module.state_dict()) for module in modules]


def train_dit(transformer: "torch.nn.Module", device: str, seed: int, *, steps: int, batch: int, max_seconds: float,
              lr: float = 6e-4, compile: bool = False, check_every: int = 250,
              log: Callable[[str], None] = print) -> tuple["torch.nn.Module", StageLog]:
    """Train ``transformer`` (diffusers DiT, pixel space) for ``steps`` or ``max_seconds``; the EMA copy.

    The step count is fixed after timing steps 20-60 to what fits ``max_seconds``, so the learning-rate
    schedule always runs to its end. Every ``check_every`` steps the window's mean loss is checked: a
    non-finite or more than doubled loss (the way a run at too high a learning rate spikes) rolls the
    model, the EMA and the optimiser back and halves the learning rate. The rollback goes to the *start*
    of the last good window, not its end: a spike can be under way while its window's mean still looks
    good, and restoring that state only spikes again. ``compile`` trains through ``torch.compile`` (the
    EMA copy stays eager).
    """
    import torch
    import torch.nn.functional as F

    torch.manual_seed(seed)
    transformer = transformer.to(device).train()
    ema = copy.deepcopy(transformer).eval().requires_grad_(False)
    forward = torch.compile(transformer) if compile else transformer
    optimiser = torch.optim.AdamW(transformer.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    params, ema_params = list(transformer.parameters()), list(ema.parameters())
    betas = torch.linspace(BETA_START, BETA_END, TRAIN_STEPS, dtype=torch.float64)
    alpha_bar = torch.cumprod(1 - betas, 0).float().to(device)
    generator = torch.Generator(device=device).manual_seed(seed + 1)
    stage, start, total, losses = StageLog(), time.perf_counter(), steps, []
    step, marks, scale, rollbacks = 0, {}, 1.0, []
    best = math.inf
    safe = pending = (0, _snapshot(transformer, ema, optimiser))  # start of the last good window; of this one
    while step < total:
        for group in optimiser.param_groups:
            group["lr"] = scale * _lr(step, total, lr, 300)
        labels, images = _batch(generator, batch)
        x0 = images * 2 - 1
        t = torch.randint(0, TRAIN_STEPS, (batch,), generator=generator, device=device)
        noise = torch.randn(x0.shape, generator=generator, device=device)
        a = alpha_bar[t].view(-1, 1, 1, 1)
        xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
        drop = torch.rand(batch, generator=generator, device=device) < LABEL_DROP
        labels = torch.where(drop, torch.full_like(labels, NUM_CLASSES), labels)
        with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16):
            predicted = forward(xt, timestep=t, class_labels=labels).sample
        loss = F.mse_loss(predicted.float(), noise)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimiser.step()
        decay = min(0.999, (1 + step) / (10 + step))
        with torch.no_grad():
            torch._foreach_lerp_(ema_params, params, 1 - decay)
        losses.append(loss.detach())
        step += 1
        if step in (TIMED_FROM, TIMED_TO):  # steps after the warm-up (allocator, autotuning) set the count
            if torch.device(device).type == "cuda":
                torch.cuda.synchronize()
            marks[step] = time.perf_counter()
        if step == TIMED_TO:
            per_step = (marks[TIMED_TO] - marks[TIMED_FROM]) / (TIMED_TO - TIMED_FROM)
            total = min(steps, max(TIMED_TO + 1, TIMED_TO + int((max_seconds - (marks[TIMED_TO] - start)) / per_step)))
            log(f"dit: {per_step * 1000:.1f} ms per step -> {total} steps")
        if step % check_every == 0:
            recent = torch.stack(losses[-check_every:]).mean().item()
            if not math.isfinite(recent) or recent > 2 * best:
                back_to, states = pending = safe
                for module, state in zip((transformer, ema, optimiser), states):
                    module.load_state_dict(state)
                scale /= 2
                rollbacks.append({"step": step, "loss": recent, "back_to": back_to, "lr_scale": scale})
                log(f"dit step {step}: loss {recent:.4f} against {best:.4f}: rolled back to step {back_to}, "
                    f"learning rate x{scale}")
            else:
                best = min(best, recent)
                safe, pending = pending, (step, _snapshot(transformer, ema, optimiser))
        if step % 500 == 0 or step == total:
            recent = torch.stack(losses[-200:]).mean().item()
            log(f"dit step {step}/{total} loss {recent:.4f} lr {optimiser.param_groups[0]['lr']:.2e} "
                f"{time.perf_counter() - start:.0f} s")
    stage.steps, stage.seconds = step, time.perf_counter() - start
    stage.numbers["final_loss"] = float(torch.stack(losses[-500:]).mean())
    stage.numbers.update(batch=batch, lr=lr, ema_decay=0.999, label_drop=LABEL_DROP, planned_steps=steps,
                         compiled=compile, rollbacks=rollbacks)
    return ema, stage
