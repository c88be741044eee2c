#!/usr/bin/env python3
"""How a shapes DiT predicts at high noise, and what diffusers' per-block label drop does to a training batch.

    python3 benchmarks/shapes_noise.py > benchmarks/results/shapes_noise_cpu.txt   # the shipped weights, CPU
    python3 benchmarks/shapes_noise.py --weights DIR       # a retrained diffusers folder (transformer/)

1. For 200 real images (20 per class, seed 7) noised to t = 999 ... 100: the noise loss, and the error of the
   x0 that the noise prediction implies, conditional and unconditional, beside the error of the mean image
   (what an ideal model approaches at t = 999).
2. For one batch of 64 at t = 600..999 (seed 11): the noise loss in eval mode, in train mode (each block's
   ``LabelEmbedding`` drops 10 % of the labels on its own draw) and in train mode with those drops off.
"""

from __future__ import annotations

import argparse
import sys

from harness import ROOT  # noqa: F401 - puts the repository on sys.path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", help="a diffusers folder of a dit-s-shapes transformer (default: shipped)")
    args = parser.parse_args()

    import torch

    from dit_impl.baseline import load_model
    from dit_impl.shapes.family import NUM_CLASSES, render
    from dit_impl.shapes.training import TRAIN_STEPS, noise_schedule, noised, single_label_drop

    torch.set_num_threads(2)
    transformer = load_model("dit-s-shapes", weights=args.weights, dtype="float32", device="cpu").transformer
    alpha_bar = noise_schedule("cpu")

    def noised_with_noise(x0: torch.Tensor, t: torch.Tensor, generator: torch.Generator
                          ) -> tuple[torch.Tensor, torch.Tensor]:
        noise = torch.randn(x0.shape, generator=generator)
        return noised(x0, t, noise, alpha_bar), noise

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
            xt, noise = noised_with_noise(x0, steps, generator)
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
    xt, noise = noised_with_noise(x0, steps, generator)
    embeddings = sum(hasattr(m, "token_drop") for m in transformer.modules())
    print(f"one batch of 64 at t = 600..999, {embeddings} label embeddings:")
    with torch.no_grad():
        for mode in ("eval", "train", "train, label drops off"):
            transformer.train(mode.startswith("train"))
            if mode.endswith("off"):
                single_label_drop(transformer)
            torch.manual_seed(0)
            loss = ((transformer(xt, timestep=steps, class_labels=labels).sample - noise) ** 2).mean().item()
            print(f"  {mode:24s} noise loss {loss:.5f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
