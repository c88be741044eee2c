#!/usr/bin/env python3
"""Probe: why the shapes DiT's training loss climbs after a rollback, even at a tiny learning rate.

Not a training run: nothing ships. One base run at a constant rate, with a snapshot before its end, then
three branches at a low rate, each for the same steps on the same batches:

- ``live``: from the base run's last state (no rollback);
- ``restored``: from the snapshot, restored the way ``dit_impl.shapes.training.train_dit`` rolls back
  (model and optimiser ``load_state_dict`` of deep copies, under the same compiled module);
- ``restored-fp32``: from the snapshot, without bf16 autocast.

Every ``--every`` steps each prints the mean training loss, the loss on one fixed evaluation batch (the same
images, timesteps and noise every time, float32, eager), the gradient norm before clipping, the loss and the
largest attention logit on a fixed batch at t = 0..50 (``dit_impl.shapes.training.watch``: the weights
trained before the logit cap read 0.43 there at t = 50 against 0.008 at t = 500, and their logits 27 760) and
the largest |x0| it predicts from noise alone at t = 999 (a sampler's first step; images lie in [-1, 1]).
If ``restored`` climbs and ``live`` does not, the rollback is the bug; if both climb and ``restored-fp32``
does not, bf16 is. ``--logit-cap 50`` trains every run with the penalty of ``dit_impl.shapes.logit_cap``.

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


def build(device: str, seed: int, compile: bool, logit_cap: float | None) -> tuple[Any, Any, Any, Any]:
    """The ``dit-s-shapes`` transformer, its compiled forward, its optimiser and its logit cap (or ``None``), as
    ``train_dit`` builds them."""
    import torch
    from diffusers import DiTTransformer2DModel

    from dit_impl.baseline.configs import get_config
    from dit_impl.shapes.logit_cap import LogitCap
    from dit_impl.shapes.training import dit_optimiser, single_label_drop

    torch.manual_seed(seed)
    model = DiTTransformer2DModel(**get_config("dit-s-shapes").transformer).to(device).train()
    single_label_drop(model)
    cap = LogitCap(model, logit_cap) if logit_cap else None
    return model, torch.compile(model) if compile else model, dit_optimiser(model, 1e-4), cap


def diagnostics(model: Any, evaluation: tuple[Any, ...], alpha_bar: Any, batches: dict[str, Any]) -> dict[str, float]:
    """Loss on the fixed batch (float32, eval mode), the loss and attention peak at low noise, max |x0| at t = 999."""
    import torch
    import torch.nn.functional as F

    from dit_impl.shapes.training import watch

    xt, t, labels, noise = evaluation
    model.eval()
    with torch.no_grad():
        loss = F.mse_loss(model(xt, timestep=t, class_labels=labels).sample.float(), noise).item()
        last = torch.full_like(t, len(alpha_bar) - 1)
        a = alpha_bar[-1]
        first = (1 - a).sqrt() * noise  # what a sampler's first step sees: noise alone
        eps = model(first, timestep=last, class_labels=labels).sample.float()
        x0 = (first - (1 - a).sqrt() * eps) / a.sqrt()
    watched = watch(model, batches)
    model.train()
    return {"eval_loss": loss, "low_noise_loss": watched["low_noise_loss"],
            "attention_peak": watched["attention_peak"], "x0_max_t999": float(x0.abs().max())}


def train(model: Any, forward: Any, optimiser: Any, cap: Any, generator: Any, steps: int, lr: float, batch: int,
          alpha_bar: Any, evaluation: tuple[Any, ...], watched: dict[str, Any], every: int, label: str, *,
          autocast: bool = True,
          warmup: int = 0, snapshot_at: int | None = None) -> tuple[list[dict[str, Any]], Any]:
    """``steps`` steps at ``lr`` (after ``warmup`` linear steps); rows every ``every`` steps; a deep copy of
    the model and optimiser states at ``snapshot_at``."""
    import torch
    import torch.nn.functional as F

    from dit_impl.shapes.training import kept_loss, noisy_batch

    device = next(model.parameters()).device
    params, rows, losses, norms, snapshot = list(model.parameters()), [], [], [], None
    started = time.perf_counter()
    for step in range(1, steps + 1):
        for group in optimiser.param_groups:
            group["lr"] = lr * min(1.0, step / warmup) if warmup else lr
        xt, t, labels, noise = noisy_batch(generator, batch, alpha_bar)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
            predicted = forward(xt, timestep=t, class_labels=labels).sample
        loss = F.mse_loss(predicted.float(), noise)
        optimiser.zero_grad(set_to_none=True)
        (loss + cap.penalty() if cap else loss).backward()
        norms.append(torch.nn.utils.clip_grad_norm_(params, 1.0).detach())
        optimiser.step()
        losses.append(kept_loss(loss))
        if step == snapshot_at:
            snapshot = (copy.deepcopy(model.state_dict()), copy.deepcopy(optimiser.state_dict()))
        if step % every == 0:
            row = {"run": label, "step": step, "lr": optimiser.param_groups[0]["lr"],
                   "train_loss": float(torch.stack(losses[-every:]).mean()),
                   "grad_norm": float(torch.stack(norms[-every:]).median()),
                   **diagnostics(model, evaluation, alpha_bar, watched),
                   "seconds": round(time.perf_counter() - started, 1)}
            if cap:
                cap.clear()  # the diagnostics' forwards are no part of the next penalty
            rows.append(row)
            print(f"{label:14s} step {step:5d} lr {row['lr']:.1e} train {row['train_loss']:.4f} "
                  f"eval {row['eval_loss']:.4f} low-t {row['low_noise_loss']:.4f} grad {row['grad_norm']:.3f} "
                  f"peak {row['attention_peak']:.0f} "
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
    parser.add_argument("--logit-cap", type=float, default=0.0,
                        help="train every run with dit_impl.shapes.logit_cap's penalty at this cap (0: none)")
    args = parser.parse_args(argv)

    import torch

    from dit_impl.shapes.training import noise_schedule, noisy_batch, restore, watch_batches

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    alpha_bar = noise_schedule(args.device)
    evaluation = noisy_batch(torch.Generator(device=args.device).manual_seed(args.seed + 99), args.eval_batch,
                             alpha_bar)
    watched = {"low_noise": watch_batches(args.device, args.seed, alpha_bar)["low_noise"]}
    model, forward, optimiser, cap = build(args.device, args.seed, not args.no_compile, args.logit_cap or None)
    generator = torch.Generator(device=args.device).manual_seed(args.seed + 1)
    started = time.perf_counter()
    rows, snapshot = train(model, forward, optimiser, cap, generator, args.base_steps, args.peak, args.batch, alpha_bar,
                           evaluation, watched, args.every, "base", warmup=300,
                           snapshot_at=args.base_steps - min(250, args.base_steps // 2))
    live = (copy.deepcopy(model.state_dict()), copy.deepcopy(optimiser.state_dict()))
    branch_seed = args.seed + 2  # every branch sees the same batches
    for label, start, autocast in (("live", live, True), ("restored", snapshot, True),
                                   ("restored-fp32", snapshot, False)):
        restore((model, optimiser), start)  # copies: two branches start from `snapshot`
        generator = torch.Generator(device=args.device).manual_seed(branch_seed)
        more, _ = train(model, forward, optimiser, cap, generator, args.branch_steps, args.low, args.batch, alpha_bar,
                        evaluation, watched, args.every, label, autocast=autocast)
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
