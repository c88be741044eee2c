#!/usr/bin/env python3
"""Probe: why the shapes DiT's training loss climbs after a rollback, even at a tiny learning rate.

Not a training run: nothing ships. One base run at a constant rate, with a snapshot before its end, then
three branches at a low rate, each for the same steps on the same batches:

- ``live``: from the base run's last state (no rollback);
- ``restored``: from the snapshot, restored the way ``dit_impl.shapes.training.train_dit`` rolls back
  (model and optimiser ``load_state_dict`` of deep copies, under the same compiled module);
- ``restored-fp32``: from the snapshot, without bf16 autocast.

Every ``--every`` steps each prints the mean training loss, the loss on one fixed evaluation batch (the same
images, timesteps and noise every time, float32, eager), the gradient norm before clipping, the product of
the query and key weight norms of the last block (the bound on attention logits that grows when they blow
up) and the largest |x0| it predicts from noise alone at t = 999 (a sampler's first step; images lie in
[-1, 1]). If ``restored`` climbs and ``live`` does not, the rollback is the bug; if both climb and
``restored-fp32`` does not, bf16 is.

    python3 benchmarks/shapes_training_probe.py --json $OUT/probe.json     # one H200: about 6 minutes
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

from harness import ROOT  # noqa: E402, F401 - puts the repository on sys.path

print = partial(print, flush=True)  # progress reaches a log as it happens


def build(device: str, seed: int, compile: bool) -> tuple[Any, Any, Any]:
    """The ``dit-s-shapes`` transformer, its compiled forward and its optimiser, as ``train_dit`` builds them."""
    import torch
    from diffusers import DiTTransformer2DModel

    from dit_impl.baseline.configs import get_config

    torch.manual_seed(seed)
    model = DiTTransformer2DModel(**get_config("dit-s-shapes").transformer).to(device).train()
    forward = torch.compile(model) if compile else model
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0)
    return model, forward, optimiser


def schedule() -> Any:
    """``alpha_bar`` of DiT's linear beta schedule (the training loop's)."""
    import torch

    from dit_impl.shapes.training import BETA_END, BETA_START, TRAIN_STEPS

    betas = torch.linspace(BETA_START, BETA_END, TRAIN_STEPS, dtype=torch.float64)
    return torch.cumprod(1 - betas, 0).float()


def noisy_batch(generator: Any, batch: int, alpha_bar: Any, device: str) -> tuple[Any, Any, Any, Any]:
    """One training batch as ``train_dit`` draws it: noised images, timesteps, labels (10 % dropped), noise."""
    import torch

    from dit_impl.shapes.family import NUM_CLASSES
    from dit_impl.shapes.training import LABEL_DROP, TRAIN_STEPS, _batch

    labels, images = _batch(generator, batch)
    x0 = images * 2 - 1
    t = torch.randint(0, TRAIN_STEPS, (batch,), generator=generator, device=device)
    noise = torch.randn(x0.shape, generator=generator, device=device)
    a = alpha_bar[t].view(-1, 1, 1, 1)
    drop = torch.rand(batch, generator=generator, device=device) < LABEL_DROP
    labels = torch.where(drop, torch.full_like(labels, NUM_CLASSES), labels)
    return a.sqrt() * x0 + (1 - a).sqrt() * noise, t, labels, noise


def diagnostics(model: Any, evaluation: tuple[Any, ...], alpha_bar: Any) -> dict[str, float]:
    """Loss on the fixed batch (float32, eval mode), the last block's |W_q| |W_k| and max |x0| at t = 999."""
    import torch
    import torch.nn.functional as F

    xt, t, labels, noise = evaluation
    model.eval()
    with torch.no_grad():
        loss = F.mse_loss(model(xt, timestep=t, class_labels=labels).sample.float(), noise).item()
        last = torch.full_like(t, len(alpha_bar) - 1)
        a = alpha_bar[-1]
        first = (1 - a).sqrt() * noise  # what a sampler's first step sees: noise alone
        eps = model(first, timestep=last, class_labels=labels).sample.float()
        x0 = (first - (1 - a).sqrt() * eps) / a.sqrt()
        attention = model.transformer_blocks[-1].attn1
        qk = float(attention.to_q.weight.norm() * attention.to_k.weight.norm())
    model.train()
    return {"eval_loss": loss, "qk_norm": qk, "x0_max_t999": float(x0.abs().max())}


def train(model: Any, forward: Any, optimiser: Any, generator: Any, steps: int, lr: float, batch: int,
          alpha_bar: Any, evaluation: tuple[Any, ...], every: int, label: str, *, autocast: bool = True,
          warmup: int = 0, snapshot_at: int | None = None) -> tuple[list[dict[str, Any]], Any]:
    """``steps`` steps at ``lr`` (after ``warmup`` linear steps); rows every ``every`` steps; a deep copy of
    the model and optimiser states at ``snapshot_at``."""
    import torch
    import torch.nn.functional as F

    device = next(model.parameters()).device
    params, rows, losses, norms, snapshot = list(model.parameters()), [], [], [], None
    started = time.perf_counter()
    for step in range(1, steps + 1):
        for group in optimiser.param_groups:
            group["lr"] = lr * min(1.0, step / warmup) if warmup else lr
        xt, t, labels, noise = noisy_batch(generator, batch, alpha_bar, str(device))
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
            predicted = forward(xt, timestep=t, class_labels=labels).sample
        loss = F.mse_loss(predicted.float(), noise)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(params, 1.0).detach())
        optimiser.step()
        losses.append(loss.detach())
        if step == snapshot_at:
            snapshot = (copy.deepcopy(model.state_dict()), copy.deepcopy(optimiser.state_dict()))
        if step % every == 0:
            row = {"run": label, "step": step, "lr": optimiser.param_groups[0]["lr"],
                   "train_loss": float(torch.stack(losses[-every:]).mean()),
                   "grad_norm": float(torch.stack(norms[-every:]).median()),
                   **diagnostics(model, evaluation, alpha_bar), "seconds": round(time.perf_counter() - started, 1)}
            rows.append(row)
            print(f"{label:14s} step {step:5d} lr {row['lr']:.1e} train {row['train_loss']:.4f} "
                  f"eval {row['eval_loss']:.4f} grad {row['grad_norm']:.3f} qk {row['qk_norm']:.1f} "
                  f"x0max {row['x0_max_t999']:.1f} {row['seconds']:.0f} s")
    return rows, snapshot


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True, help="where to write the rows")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--base-steps", type=int, default=3500)
    parser.add_argument("--branch-steps", type=int, default=1500)
    parser.add_argument("--peak", type=float, default=4e-4, help="the base run's rate (after 300 warm-up steps)")
    parser.add_argument("--low", type=float, default=2e-5, help="the branches' rate")
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--eval-batch", type=int, default=2048)
    parser.add_argument("--no-compile", action="store_true")
    args = parser.parse_args(argv)

    import torch

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    alpha_bar = schedule().to(args.device)
    evaluation = noisy_batch(torch.Generator(device=args.device).manual_seed(args.seed + 99), args.eval_batch,
                             alpha_bar, args.device)
    model, forward, optimiser = build(args.device, args.seed, not args.no_compile)
    generator = torch.Generator(device=args.device).manual_seed(args.seed + 1)
    started = time.perf_counter()
    rows, snapshot = train(model, forward, optimiser, generator, args.base_steps, args.peak, args.batch, alpha_bar,
                           evaluation, args.every, "base", warmup=300,
                           snapshot_at=args.base_steps - min(250, args.base_steps // 2))
    live = (copy.deepcopy(model.state_dict()), copy.deepcopy(optimiser.state_dict()))
    branch_seed = args.seed + 2  # every branch sees the same batches
    for label, start, autocast in (("live", live, True), ("restored", snapshot, True),
                                   ("restored-fp32", snapshot, False)):
        model.load_state_dict(start[0])
        optimiser.load_state_dict(start[1])
        generator = torch.Generator(device=args.device).manual_seed(branch_seed)
        more, _ = train(model, forward, optimiser, generator, args.branch_steps, args.low, args.batch, alpha_bar,
                        evaluation, args.every, label, autocast=autocast)
        rows += more
    device = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    record = {"what": "shapes DiT training probe (benchmarks/shapes_training_probe.py): rollback vs bf16",
              "argv": sys.argv[1:] if argv is None else argv, "device": device, "torch": torch.__version__,
              "seconds": round(time.perf_counter() - started, 1), "rows": rows}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
