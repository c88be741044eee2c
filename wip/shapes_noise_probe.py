#!/usr/bin/env python3
"""CPU experiment (thirteenth session): how a shapes DiT predicts at high noise, and what diffusers' per-block
label drop does to a training batch. Not a benchmark of the project; it produced the numbers in wip/README.md
and docs/quality_calibration.md.

    python3 wip/shapes_noise_probe.py                     # the shipped weights
    python3 wip/shapes_noise_probe.py --weights DIR       # a retrained diffusers folder (transformer/)

1. For 200 real images (20 per class, seed 7) noised to t = 999 ... 100: the noise loss, and the error of the
   x0 that the noise prediction implies, conditional and unconditional, beside the error of the mean image
   (what an ideal model approaches at t = 999).
2. For one batch of 64 at t = 600..999 (seed 11): the noise loss in eval mode, in train mode (each block's
   ``LabelEmbedding`` drops 10 % of the labels on its own draw) and in train mode with those drops off.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", help="a diffusers folder of a dit-s-shapes transformer (default: shipped)")
    args = parser.parse_args()

    import torch

    from dit_impl.baseline import load_model
    from dit_impl.shapes.family import NUM_CLASSES, render
    from dit_impl.shapes.training import BETA_END, BETA_START, TRAIN_STEPS

    torch.set_num_threads(2)
    transformer = load_model("dit-s-shapes", weights=args.weights, dtype="float32", device="cpu").transformer
    betas = torch.linspace(BETA_START, BETA_END, TRAIN_STEPS, dtype=torch.float64)
    alpha_bar = torch.cumprod(1 - betas, 0).float()

    def noised(x0: torch.Tensor, t: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        noise = torch.randn(x0.shape, generator=generator)
        a = alpha_bar[t].view(-1, 1, 1, 1)
        return a.sqrt() * x0 + (1 - a).sqrt() * noise, noise

    generator = torch.Generator().manual_seed(7)
    labels = torch.arange(NUM_CLASSES).repeat_interleave(20)
    x0 = render(labels, generator) * 2 - 1
    mean_error = ((x0.mean(0, keepdim=True) - x0) ** 2).mean().item()
    null = torch.full_like(labels, NUM_CLASSES)
    transformer.eval()
    print(f"   t  noise loss  x0 error  x0 error (no label)  (mean image: {mean_error:.3f})")
    with torch.no_grad():
        for t in (999, 950, 900, 800, 700, 600, 500, 300, 100):
            steps = torch.full((len(x0),), t)
            xt, noise = noised(x0, steps, generator)
            a = alpha_bar[t]

            def x0_error(predicted: torch.Tensor) -> float:
                return (((xt - (1 - a).sqrt() * predicted) / a.sqrt() - x0) ** 2).mean().item()

            conditional = transformer(xt, timestep=steps, class_labels=labels).sample
            unconditional = transformer(xt, timestep=steps, class_labels=null).sample
            print(f"{t:4d} {((conditional - noise) ** 2).mean().item():11.5f} {x0_error(conditional):9.3f} "
                  f"{x0_error(unconditional):20.3f}")

    generator = torch.Generator().manual_seed(11)
    labels = torch.randint(0, NUM_CLASSES, (64,), generator=generator)
    x0 = render(labels, generator) * 2 - 1
    steps = torch.randint(600, TRAIN_STEPS, (64,), generator=generator)
    xt, noise = noised(x0, steps, generator)
    drops = [m for m in transformer.modules() if hasattr(m, "token_drop")]
    print(f"one batch of 64 at t = 600..999, {len(drops)} label embeddings:")
    with torch.no_grad():
        for mode, drop in (("eval", None), ("train", None), ("train, label drops off", 0.0)):
            getattr(transformer, mode.split(",")[0])()
            for module in drops:
                module.dropout_prob = module.dropout_prob if drop is None else drop
            torch.manual_seed(0)
            loss = ((transformer(xt, timestep=steps, class_labels=labels).sample - noise) ** 2).mean().item()
            print(f"  {mode:24s} noise loss {loss:.5f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
