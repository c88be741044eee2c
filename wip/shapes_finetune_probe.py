#!/usr/bin/env python3
"""CPU experiment (twelfth session): fine-tune the shipped shapes DiT, watch low-noise loss and attention peak,
then sample and score it. Not a benchmark of the project; it produced the numbers in wip/README.md.

    python3 wip/shapes_finetune_probe.py --steps 100                      # float32, no cap
    python3 wip/shapes_finetune_probe.py --steps 150 --cap 50 --weight 0.01
    python3 wip/shapes_finetune_probe.py --steps 10 --bf16                # bf16 autocast (slow on a CPU)
    python3 wip/shapes_finetune_probe.py --steps 1 --attribute            # which weights' share repairs it
    python3 wip/shapes_finetune_probe.py --steps 2 --every 1 --compile --attribute   # through torch.compile

Fine-tunes with AdamW (betas 0.9/0.99, no weight decay, gradient clipping at 1), no EMA, on batches from the
family (data seed 1); every ``--every`` steps prints the float32 loss and largest attention logit on fixed
batches at t = 0, 50 and 500. Then samples 10 images per class (DDIM 50, guidance 4, seed 0: the same
noise as ``dit_impl.baseline.sample``) and prints the classifier's accuracy per class.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--cap", type=float, default=0.0, help="logit cap of the penalty (0: none)")
    parser.add_argument("--weight", type=float, default=0.01)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--compile", action="store_true", help="train through torch.compile (evaluate eager)")
    parser.add_argument("--every", type=int, default=25)
    parser.add_argument("--per-class", type=int, default=10)
    parser.add_argument("--attribute", action="store_true",
                        help="after the steps, apply their change to one group of weights at a time; no sampling")
    args = parser.parse_args()

    import torch
    import torch.nn.functional as F

    from dit_impl.baseline import load_model
    from dit_impl.baseline.sampling import sample
    from dit_impl.shapes.family import NUM_CLASSES, render
    from dit_impl.shapes.scorer import scorer
    from dit_impl.shapes.training import BETA_END, BETA_START, TRAIN_STEPS
    from pytest_ditgate.quality import learned

    model = load_model("dit-s-shapes", dtype="float32", device="cpu")
    transformer = model.transformer
    betas = torch.linspace(BETA_START, BETA_END, TRAIN_STEPS, dtype=torch.float64)
    alpha_bar = torch.cumprod(1 - betas, 0).float()
    maxima: list[torch.Tensor] = []

    def keep(module, hook_args, kwargs, _output):
        hidden = hook_args[0] if hook_args else kwargs["hidden_states"]
        batch, tokens, _ = hidden.shape
        q = module.to_q(hidden).view(batch, tokens, module.heads, -1).transpose(1, 2)
        k = module.to_k(hidden).view(batch, tokens, module.heads, -1).transpose(1, 2)
        maxima.append((q @ k.transpose(-1, -2)).amax(-1) / math.sqrt(q.shape[-1]))

    for block in transformer.transformer_blocks:
        block.attn1.register_forward_hook(keep, with_kwargs=True)

    def draw(generator, n, t=None):
        labels = torch.randint(0, NUM_CLASSES, (n,), generator=generator)
        x0 = render(labels, generator) * 2 - 1
        t = torch.randint(0, 1000, (n,), generator=generator) if t is None else torch.full((n,), t)
        noise = torch.randn(x0.shape, generator=generator)
        a = alpha_bar[t].view(-1, 1, 1, 1)
        return a.sqrt() * x0 + (1 - a).sqrt() * noise, t, labels, noise

    fixed = {t: draw(torch.Generator().manual_seed(99 + t), 64, t) for t in (0, 50, 500)}

    def evaluate() -> str:
        transformer.eval()
        parts = []
        with torch.no_grad():
            for t, (xt, tt, labels, noise) in fixed.items():
                maxima.clear()
                loss = F.mse_loss(transformer(xt, timestep=tt, class_labels=labels).sample, noise).item()
                parts.append(f"t={t}: loss {loss:.4f} peak {max(float(m.max()) for m in maxima):.1f}")
        transformer.train()
        return "; ".join(parts)

    forward = torch.compile(transformer) if args.compile else transformer
    print("start", evaluate(), flush=True)
    before = {name: value.clone() for name, value in transformer.state_dict().items()}
    optimiser = torch.optim.AdamW(transformer.parameters(), lr=args.lr, betas=(0.9, 0.99), weight_decay=0.0)
    generator = torch.Generator().manual_seed(1)
    transformer.train()
    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        xt, t, labels, noise = draw(generator, args.batch)
        maxima.clear()
        torch.manual_seed(step)  # diffusers' LabelEmbedding drops labels from the global generator in train mode
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            predicted = forward(xt, timestep=t, class_labels=labels).sample
        loss = F.mse_loss(predicted.float(), noise)
        if args.cap:
            penalty = sum((F.relu(m.float() - args.cap) ** 2).mean() for m in maxima) / args.cap ** 2
            loss = loss + args.weight * penalty
        optimiser.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(transformer.parameters(), 1.0)
        optimiser.step()
        if step % args.every == 0:
            print(step, evaluate(), f"{time.perf_counter() - started:.0f} s", flush=True)
    if args.attribute:
        after = {name: value.clone() for name, value in transformer.state_dict().items()}
        blocks = len(transformer.transformer_blocks)
        groups = {"block 0": ["transformer_blocks.0."], "block 1": ["transformer_blocks.1."],
                  "block 1 attention": ["transformer_blocks.1.attn1."],
                  "block 1 adaLN": ["transformer_blocks.1.norm1."], "block 1 MLP": ["transformer_blocks.1.ff."],
                  f"blocks 2-{blocks - 1}": [f"transformer_blocks.{i}." for i in range(2, blocks)],
                  "patch embedding": ["pos_embed."], "final layer": ["proj_out", "norm_out"]}
        for name, prefixes in groups.items():
            transformer.load_state_dict({key: after[key] if any(key.startswith(p) for p in prefixes) else before[key]
                                         for key in before})
            print(f"only {name}:", evaluate(), flush=True)
        return 0
    transformer.eval()
    labels = [label for label in range(NUM_CLASSES) for _ in range(args.per_class)]
    images = sample(model, labels, seed=0, steps=50, guidance_scale=4.0).images
    predicted = scorer("cpu").logits(images).argmax(1)
    per_class = [float((predicted[i * args.per_class:(i + 1) * args.per_class] == i).float().mean())
                 for i in range(NUM_CLASSES)]
    print("accuracy", learned.class_accuracy(scorer("cpu"), images, labels), per_class, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
