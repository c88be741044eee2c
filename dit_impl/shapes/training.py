"""Training of the shapes classifier and the shapes DiT on images drawn on the fly from the family.

Data streams are seeded from one data seed (classifier: seed, DiT: seed + 1, held-out accuracy: seed + 2,
Frechet reference: seed + 3, the DiT's watched batches: seed + ``WATCH_STREAMS``), so a manifest's data seed says which
images each stage saw. The DiT learns epsilon prediction on DiT's linear beta schedule (the one the baseline
samplers use), with 10 % of the labels dropped to the null class for classifier-free guidance (diffusers'
own extra drop switched off), in bf16 autocast with an EMA of the weights; the EMA of the window with the
lowest loss ships. A penalty can keep attention logits under a cap (``dit_impl.shapes.logit_cap``; the shipped
weights were trained with it).
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
#: a window whose mean loss is more than SPIKE_FACTOR times the median of the last SPIKE_WINDOWS accepted
#: windows is a spike (rolled back). A slow climb is no spike: the weights that ship are the EMA at the end of
#: the window with the lowest mean loss (an early stop). On the H200 the loss spiked at the full rate and, at
#: an eighth of it, climbed from 0.0122 to 0.0228 over 4000 steps (benchmarks/results/
#: shapes_training_probe_sm_90.txt); judged against the best window ever, every later window was a spike
SPIKE_FACTOR, SPIKE_WINDOWS = 2.0, 4
#: the model and its EMA are watched on fixed batches: PEAK_IMAGES at t = 0..PEAK_MAX_T, where an uncapped
#: EMA's logits run away and its loss is 0.43 at t = 50 (0.008 at t = 500: a mean over every t hides it), and
#: SPREAD_IMAGES at every fourth t, the loss training minimises without the noise of a random batch
PEAK_IMAGES, PEAK_MAX_T, SPREAD_IMAGES = 64, 50, 250
#: the watched batches' data streams, as offsets of the data seed (streams 0-3: classifier, DiT, held-out
#: accuracy, Frechet reference)
WATCH_STREAMS = {"low_noise": 4, "spread": 5}
#: the logit cap's penalty reads the attention of this many images of each training batch (random timesteps,
#: so every noise level is in it; the whole batch of 1024 would add a quarter to the step)
CAP_IMAGES = 256
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


def recent_level(accepted: list[float]) -> float:
    """The median mean loss of the last accepted windows (infinite before the first)."""
    import statistics

    return statistics.median(accepted[-SPIKE_WINDOWS:]) if accepted else math.inf


def spiked(recent: float, accepted: list[float]) -> bool:
    """Whether a window's mean loss is a divergence: not finite, or far above the recent accepted level."""
    return not math.isfinite(recent) or recent > SPIKE_FACTOR * recent_level(accepted)


def kept_loss(loss: "torch.Tensor") -> "torch.Tensor":
    """A detached copy of a scalar loss that owns only its own value. ``F.mse_loss`` returns a 0-dim tensor
    over the storage of its unreduced batch (12.6 MB at batch 1024): keeping ``loss.detach()`` for every step
    held 130 GB after 10 000 steps on the H200 and ran out of memory."""
    return loss.detach().clone()


def single_label_drop(transformer: "torch.nn.Module") -> None:
    """Switch off diffusers' own label drop: each block's ``LabelEmbedding`` drops 10 % in train mode, each on
    its own draw, so 57 % of a batch saw the null class in some blocks only. The loop drops ``LABEL_DROP``."""
    for module in transformer.modules():
        if hasattr(module, "token_drop") and hasattr(module, "dropout_prob"):
            module.dropout_prob = 0.0


def _snapshot(*modules: Any) -> list[dict[str, Any]]:
    """Copies of the state of ``modules`` (models and the optimiser), to roll back to after a divergence."""
    return [copy.deepcopy(module.state_dict()) for module in modules]


def restore(modules: tuple[Any, ...], states: list[dict[str, Any]]) -> None:
    """Load a ``_snapshot`` (``[module.state_dict() ...]``) into ``modules`` as copies: an optimiser's ``load_state_dict`` keeps the tensors it
    is given when device and dtype match, so its next steps would write into the snapshot (and a second
    rollback to it would restore what the collapse wrote)."""
    for module, state in zip(modules, states):
        module.load_state_dict(copy.deepcopy(state))


def noise_schedule(device: str) -> "torch.Tensor":
    """``alpha_bar`` of DiT's linear beta schedule, the one the DiT is trained and sampled on."""
    import torch

    betas = torch.linspace(BETA_START, BETA_END, TRAIN_STEPS, dtype=torch.float64)
    return torch.cumprod(1 - betas, 0).float().to(device)


def noised(x0: "torch.Tensor", t: "torch.Tensor", noise: "torch.Tensor", alpha_bar: "torch.Tensor") -> "torch.Tensor":
    """Images ``x0`` in [-1, 1] noised to the timesteps ``t`` (the forward process the DiT learns to undo)."""
    a = alpha_bar[t].view(-1, 1, 1, 1)
    return a.sqrt() * x0 + (1 - a).sqrt() * noise


def noisy_batch(generator: "torch.Generator", batch: int, alpha_bar: "torch.Tensor"
                ) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor", "torch.Tensor"]:
    """One training batch drawn from ``generator``: the noised images, their timesteps, their labels (the
    ``LABEL_DROP`` share dropped to the null class) and the noise the DiT learns to predict."""
    import torch

    device = generator.device
    labels, images = _batch(generator, batch)
    x0 = images * 2 - 1
    t = torch.randint(0, TRAIN_STEPS, (batch,), generator=generator, device=device)
    noise = torch.randn(x0.shape, generator=generator, device=device)
    drop = torch.rand(batch, generator=generator, device=device) < LABEL_DROP
    labels = torch.where(drop, torch.full_like(labels, NUM_CLASSES), labels)
    return noised(x0, t, noise, alpha_bar), t, labels, noise


def fixed_batch(device: str, seed: int, alpha_bar: "torch.Tensor", t: "torch.Tensor"
                ) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor", "torch.Tensor"]:
    """Images drawn from ``seed`` noised to the timesteps ``t`` (noised images, timesteps, labels, noise)."""
    import torch

    generator = torch.Generator(device=device).manual_seed(seed)
    labels, images = _batch(generator, len(t))
    t = t.to(device)
    noise = torch.randn(images.shape, generator=generator, device=device)
    return noised(images * 2 - 1, t, noise, alpha_bar), t, labels, noise


def watch_batches(device: str, seed: int, alpha_bar: "torch.Tensor") -> dict[str, tuple["torch.Tensor", ...]]:
    """The fixed batches a run with data seed ``seed`` is watched on (drawn from ``seed`` + ``WATCH_STREAMS``):
    ``low_noise`` (t = 0..``PEAK_MAX_T``) and ``spread`` (every t)."""
    import torch

    timesteps = {"low_noise": torch.arange(PEAK_IMAGES) % (PEAK_MAX_T + 1),
                 "spread": torch.linspace(0, TRAIN_STEPS - 1, SPREAD_IMAGES).round().long()}
    return {name: fixed_batch(device, seed + WATCH_STREAMS[name], alpha_bar, t) for name, t in timesteps.items()}


def watch(transformer: "torch.nn.Module", batches: dict[str, tuple["torch.Tensor", ...]]) -> dict[str, float]:
    """Float32 losses of ``transformer`` on the ``watch_batches``, and its largest attention logit at low noise."""
    import torch.nn.functional as F

    from dit_impl.shapes.logit_cap import attention_peak, eval_prediction

    numbers = {}
    for name, (xt, t, labels, noise) in batches.items():
        if name == "low_noise":
            peak, prediction = attention_peak(transformer, xt, t, labels)
            numbers["attention_peak"] = round(peak, 1)
        else:
            prediction = eval_prediction(transformer, xt, t, labels)
        numbers[f"{name}_loss"] = round(float(F.mse_loss(prediction.float(), noise)), 6)
    return numbers


def dit_optimiser(transformer: "torch.nn.Module", lr: float) -> "torch.optim.Optimizer":
    """The DiT's optimiser (AdamW, betas 0.9/0.99, no weight decay)."""
    import torch

    return torch.optim.AdamW(transformer.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)


def _watched(window: dict[str, Any]) -> str:
    model, ema = window["model"], window["ema"]
    return (f"t <= {PEAK_MAX_T}: {model['low_noise_loss']:.4f}, EMA {ema['low_noise_loss']:.4f}; every t: "
            f"{model['spread_loss']:.4f}, EMA {ema['spread_loss']:.4f}; attention peak {model['attention_peak']:.0f}, "
            f"EMA {ema['attention_peak']:.0f}")


def train_dit(transformer: "torch.nn.Module", device: str, seed: int, *, steps: int, batch: int, max_seconds: float,
              lr: float = 6e-4, compile: bool = False, check_every: int = 250,
              logit_cap: float | None = None,
              log: Callable[[str], None] = print) -> tuple["torch.nn.Module", StageLog]:
    """Train ``transformer`` (diffusers DiT, pixel space) for ``steps`` or ``max_seconds``; the EMA copy.

    The step count is fixed after timing steps 20-60 to what fits ``max_seconds``, so the learning-rate
    schedule always runs to its end. Every ``check_every`` steps the window's mean loss is checked: a
    non-finite loss, or one more than twice the recent level (the way a run at too high a learning rate
    spikes), rolls the model, the EMA and the optimiser back and halves the learning rate. The rollback goes
    to the *start* of the last good window, not its end: a spike can be under way while its window's mean
    still looks good, and restoring that state only spikes again. The EMA returned is the one at the end of
    the accepted window with the lowest mean loss (a slow climb is no spike). ``compile`` trains through
    ``torch.compile`` (the EMA copy stays eager). ``logit_cap`` adds the penalty of
    :class:`~dit_impl.shapes.logit_cap.LogitCap` (``None``: none); with or without it, each window records
    the losses of the model and of its EMA on fixed batches, and their largest attention logits (``watch``).
    """
    import torch
    import torch.nn.functional as F

    from dit_impl.shapes.logit_cap import LogitCap

    torch.manual_seed(seed)
    transformer = transformer.to(device).train()
    single_label_drop(transformer)
    ema = copy.deepcopy(transformer).eval().requires_grad_(False)
    cap = LogitCap(transformer, logit_cap, images=CAP_IMAGES) if logit_cap else None  # hooks go in before the compile traces them
    forward = torch.compile(transformer) if compile else transformer
    optimiser = dit_optimiser(transformer, lr)
    params, ema_params = list(transformer.parameters()), list(ema.parameters())
    alpha_bar = noise_schedule(device)
    generator = torch.Generator(device=device).manual_seed(seed + 1)
    watched = watch_batches(device, seed, alpha_bar)
    stage, start, total, losses = StageLog(), time.perf_counter(), steps, []
    step, marks, scale, rollbacks = 0, {}, 1.0, []
    accepted: list[float] = []  # mean loss of every window kept
    windows: list[dict[str, Any]] = []  # every window's mean loss and watched numbers, for the manifest
    lowest: tuple[int, float, dict[str, Any]] | None = None  # the window that ships: step, loss, EMA state
    safe = pending = (0, _snapshot(transformer, ema, optimiser))  # start of the last good window; of this one
    while step < total:
        for group in optimiser.param_groups:
            group["lr"] = scale * _lr(step, total, lr, 300)
        xt, t, labels, noise = noisy_batch(generator, batch, alpha_bar)
        with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16):
            predicted = forward(xt, timestep=t, class_labels=labels).sample
        loss = F.mse_loss(predicted.float(), noise)
        optimiser.zero_grad(set_to_none=True)
        (loss + cap.penalty() if cap else loss).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimiser.step()
        decay = min(0.999, (1 + step) / (10 + step))
        with torch.no_grad():
            torch._foreach_lerp_(ema_params, params, 1 - decay)
        losses.append(kept_loss(loss))
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
            window = {"step": step, "loss": round(recent, 6), "model": watch(transformer, watched),
                      "ema": watch(ema, watched)}
            if cap:
                cap.clear()  # the watched batches' rows are no part of the next step's penalty
            windows.append(window)
            if spiked(recent, accepted):
                back_to, states = pending = safe
                restore((transformer, ema, optimiser), states)
                scale /= 2
                rollbacks.append({"step": step, "loss": recent, "back_to": back_to, "lr_scale": scale})
                log(f"dit step {step}: loss {recent:.4f} ({_watched(window)}) against a recent level of "
                    f"{recent_level(accepted):.4f}: rolled back to step {back_to}, learning rate x{scale}")
            else:
                accepted.append(recent)
                safe, pending = pending, (step, _snapshot(transformer, ema, optimiser))
                if lowest is None or recent < lowest[1]:
                    lowest = (step, recent, copy.deepcopy(ema.state_dict()))
        if step % 500 == 0 or step == total:
            recent = torch.stack(losses[-200:]).mean().item()
            seen = f" ({_watched(windows[-1])})" if windows else ""
            held = (f" {torch.cuda.memory_allocated() / 2**30:.1f} GiB held"
                    if torch.device(device).type == "cuda" else "")
            log(f"dit step {step}/{total} loss {recent:.4f}{seen} lr {optimiser.param_groups[0]['lr']:.2e} "
                f"{time.perf_counter() - start:.0f} s{held}")
    stage.steps, stage.seconds = step, time.perf_counter() - start
    stage.numbers["final_loss"] = float(torch.stack(losses[-500:]).mean())
    if lowest is not None:
        ema.load_state_dict(lowest[2])
        log(f"dit: shipping the EMA at step {lowest[0]} (window loss {lowest[1]:.4f})")
    if cap:
        cap.remove()
    stage.numbers.update(batch=batch, lr=lr, ema_decay=0.999, label_drop=LABEL_DROP, planned_steps=steps,
                         compiled=compile, logit_cap={"cap": cap.cap, "weight": cap.weight, "images": cap.images} if cap else None,
                         watched={"low_noise": {"images": PEAK_IMAGES, "t": [0, PEAK_MAX_T],
                                                "seed": seed + WATCH_STREAMS["low_noise"]},
                                  "spread": {"images": SPREAD_IMAGES, "t": [0, TRAIN_STEPS - 1],
                                             "seed": seed + WATCH_STREAMS["spread"]}},
                         rollbacks=rollbacks, windows=windows,
                         shipped={"step": lowest[0], "window_loss": lowest[1]} if lowest else None)
    return ema, stage
