#!/usr/bin/env python3
"""Attention logits of the shapes DiT per block and noise level, and what bf16 rounding does to them.

    python3 benchmarks/shapes_attention.py --json benchmarks/results/shapes_attention_cpu.json
    python3 benchmarks/shapes_attention.py --weights DIR --device cuda   # a retrained diffusers folder

Real images of the family are noised to each timestep (fixed seeds) and run through the transformer in
float32, eager. For every block's self-attention the script recomputes the pre-softmax logits
``q k^T / sqrt(d)`` from the attention's input and reports:

- the largest |logit|, and the median over queries of each query's largest logit;
- the attention entropy (mean over queries, least over heads; ``ln(tokens)`` is uniform attention);
- the median token norm of the attention's input (adaLN-modulated) against that of the block's input;
- what bf16 does: the largest change of a logit when q and k are rounded to bf16 (as under autocast) and
  the largest total-variation distance between the float32 and the bf16-rounded attention rows;
- per timestep, the model's loss (the MSE of its noise prediction, what training minimises) in float32 and
  under bf16 autocast: a mean over all timesteps, as training logs it, hides a noise level that is broken.

Diffusers' DiT has no QK norm: adaLN's scale multiplies the attention input, so logits can grow without
bound at the noise levels where training pushes attention to be sharp. Where a logit is in the thousands,
bf16's 8-bit mantissa moves it by tens and the softmax row is another one (whether that harms training is
not shown: the shipped weights' loss is the same in both). The table is printed last; ``--json`` writes it
with provenance.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from harness import ROOT, log  # noqa: F401 - puts the repository on sys.path
from shapes_calibration import provenance

DEFAULT_TIMESTEPS = (999, 500, 200, 50, 10, 0)


def attention_inputs(transformer: Any) -> tuple[dict[int, Any], dict[int, Any], list[Any]]:
    """Hooks that keep each block's input and its self-attention's input (last forward); their handles."""
    block_in: dict[int, Any] = {}
    attn_in: dict[int, Any] = {}

    def keep(store: dict[int, Any], index: int):
        def hook(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            store[index] = args[0] if args else kwargs["hidden_states"]
        return hook

    handles = []
    for index, block in enumerate(transformer.transformer_blocks):
        handles.append(block.register_forward_pre_hook(keep(block_in, index), with_kwargs=True))
        handles.append(block.attn1.register_forward_pre_hook(keep(attn_in, index), with_kwargs=True))
    return block_in, attn_in, handles


def logit_statistics(attention: Any, hidden: Any, block_input: Any) -> dict[str, float]:
    """The numbers of one block at one noise level (see the module docstring)."""
    import torch

    from dit_impl.shapes.logit_cap import attention_logits

    logits = attention_logits(attention, hidden)
    rounded = attention_logits(attention, hidden, round_to=torch.bfloat16)
    probs, probs_bf16 = logits.softmax(-1), rounded.softmax(-1)
    entropy = -(probs * probs.clamp_min(1e-30).log()).sum(-1).mean(dim=(0, 2))
    return {"max_logit": float(logits.abs().amax()),
            "median_row_max": float(logits.amax(-1).median()),
            "entropy_min_head": float(entropy.min()),
            "attn_input_norm": float(hidden.norm(dim=-1).median()),
            "block_input_norm": float(block_input.norm(dim=-1).median()),
            "bf16_logit_error": float((rounded - logits).abs().amax()),
            "bf16_row_tv": float(0.5 * (probs_bf16 - probs).abs().sum(-1).amax())}


def measure(transformer: Any, timesteps: list[int], images: int, seed: int, device: str
            ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One row per (timestep, block), and one per timestep with the model's loss in float32 and bf16."""
    import torch
    import torch.nn.functional as F

    from dit_impl.shapes.family import real_images
    from dit_impl.shapes.training import noise_schedule, noised

    labels, pictures = real_images(images, seed, device=device)
    x0 = pictures * 2 - 1
    alpha_bar = noise_schedule(device)
    block_in, attn_in, handles = attention_inputs(transformer)
    rows, losses = [], []
    try:
        for t in timesteps:
            generator = torch.Generator(device=device).manual_seed(seed + 1 + t)
            noise = torch.randn(x0.shape, generator=generator, device=device)
            timestep = torch.full((images,), t, device=device)
            xt = noised(x0, timestep, noise, alpha_bar)
            with torch.no_grad():
                predicted = transformer(xt, timestep=timestep, class_labels=labels).sample
                for index, block in enumerate(transformer.transformer_blocks):
                    rows.append({"t": t, "block": index,
                                 **logit_statistics(block.attn1, attn_in[index], block_in[index])})
                with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16):
                    rounded = transformer(xt, timestep=timestep, class_labels=labels).sample
            losses.append({"t": t, "loss": float(F.mse_loss(predicted.float(), noise)),
                           "loss_bf16": float(F.mse_loss(rounded.float(), noise))})
    finally:
        for handle in handles:
            handle.remove()
    return rows, losses


def table(rows: list[dict[str, Any]], losses: list[dict[str, Any]], tokens: int) -> str:
    lines = ["loss of the noise prediction per timestep (float32 / bf16 autocast): " + ", ".join(
        f"t={r['t']} {r['loss']:.4f}/{r['loss_bf16']:.4f}" for r in losses), ""]
    lines += [f"{'t':>4} {'blk':>3} {'max|logit|':>10} {'row max':>8} {'entropy':>7} {'|attn in|':>9} "
             f"{'|blk in|':>8} {'bf16 dlogit':>11} {'bf16 TV':>7}   (uniform entropy ln {tokens} = "
             f"{math.log(tokens):.2f})"]
    for r in rows:
        lines.append(f"{r['t']:>4} {r['block']:>3} {r['max_logit']:>10.1f} {r['median_row_max']:>8.1f} "
                     f"{r['entropy_min_head']:>7.2f} {r['attn_input_norm']:>9.1f} {r['block_input_norm']:>8.1f} "
                     f"{r['bf16_logit_error']:>11.3f} {r['bf16_row_tv']:>7.3f}")
    return "\n".join(lines)


def weights_record(weights: str | None) -> dict[str, Any]:
    """Which weights were measured: the shipped bundle's transformer sha256, or the folder given."""
    if weights is not None:
        return {"folder": Path(weights).name}
    from dit_impl.shapes.bundle import WEIGHTS_DIR, verify_bundle

    manifest = verify_bundle(WEIGHTS_DIR)
    name = "transformer/diffusion_pytorch_model.safetensors"
    return {"bundle": "fixtures/shapes", "sha256": manifest["files"][name]["sha256"],
            "trained": manifest.get("created"), "dit_final_loss": manifest.get("dit", {}).get("final_loss")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the rows and provenance here")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--weights", help="a diffusers folder of a dit-s-shapes transformer (default: shipped)")
    parser.add_argument("--images", type=int, default=40)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--timesteps", default=",".join(map(str, DEFAULT_TIMESTEPS)))
    args = parser.parse_args(argv)

    import diffusers
    import torch

    from dit_impl.baseline import load_model

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # float32 means float32
    started = time.perf_counter()
    timesteps = [int(t) for t in args.timesteps.split(",")]
    if not all(0 <= t < 1000 for t in timesteps):
        parser.error(f"timesteps must lie in 0..999, got {timesteps}")
    model = load_model("dit-s-shapes", weights=args.weights, dtype="float32", device=args.device)
    transformer = model.transformer.eval()
    rows, losses = measure(transformer, timesteps, args.images, args.seed, args.device)
    tokens = (transformer.config.sample_size // transformer.config.patch_size) ** 2
    command = "python3 benchmarks/shapes_attention.py " + " ".join(sys.argv[1:] if argv is None else argv)
    record = {"what": "attention logits of dit-s-shapes per block and timestep (benchmarks/shapes_attention.py)",
              "weights": weights_record(args.weights), "images": args.images, "seed": args.seed,
              **provenance(args.device, started, command), "diffusers": diffusers.__version__,
              "losses": losses, "rows": rows}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        log(f"wrote {args.json}")
    print(table(rows, losses, tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main())
