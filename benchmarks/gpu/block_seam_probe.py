"""Is fusing the seam between two DiT blocks worth a lane experiment? (issue 18)

The fast forward runs three adaLN kernels per block: LayerNorm + modulate before attention, the fused
gated residual + LayerNorm + modulate between attention and MLP, and a lone gated residual after the MLP;
after the last block, PyTorch ops apply the output LayerNorm and modulation. The fused kernel can also
close each block: block i's MLP residual and block i+1's pre-attention LayerNorm are one
``residual_norm_modulate`` (the last block's with the output shift and scale). That leaves one lone
``norm_modulate`` in the whole forward and removes 27 kernels, the output LayerNorm's PyTorch ops and their
graph gaps.

This probe builds that forward from the model's own modules (no change to ``dit_impl``) and measures it
side by side with the stock fastest forward, both as CUDA graphs, interleaved round by round:

    python benchmarks/gpu/block_seam_probe.py --out results.json

It prints a table last: median ms of each, the paired ratio with its 95 % interval, rel-L2 of each against
the float32 diffusers forward, and the largest difference between the two.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import environment, log  # noqa: E402

FASTEST = "cuda_graphs=1,gelu_epilogue=1,adaln=kernels,sdpa=cudnn"


def seam_forward(self, hidden_states, timestep=None, class_labels=None, return_dict=True, **_ignored):
    """``FastDiT.forward`` with every block's closing residual fused into the next LayerNorm + modulate."""
    import torch
    import torch.nn.functional as F

    from dit_impl.fast.model import EPS_ATTN, EPS_MLP, EPS_OUT, FastOutput

    batch = hidden_states.shape[0]
    timestep = torch.as_tensor(timestep, device=hidden_states.device).reshape(-1).expand(batch)
    p, grid = self.shape.patch_size, hidden_states.shape[-1] // self.shape.patch_size
    x = self.patch(hidden_states).flatten(2).transpose(1, 2)
    x = (x + self.pos_embed).to(x.dtype).contiguous()
    if not torch.compiler.is_compiling():
        self._probe_attention(batch, x.shape[1])
    emb, mod = self.cond(timestep, class_labels)
    shift_out, scale_out = self.proj_out_1(F.silu(emb[0])).chunk(2, dim=1)
    ops, blocks = self.adaln_impl, self.transformer_blocks
    chunks = [mod[i].chunk(6, dim=1) for i in range(len(blocks))]
    h = ops.norm_modulate(x, chunks[0][0], chunks[0][1], EPS_ATTN)
    for i, block in enumerate(blocks):
        _, _, gate_msa, shift_mlp, scale_mlp, gate_mlp = chunks[i]
        x, h = ops.residual_norm_modulate(x, gate_msa, block.attention(h), shift_mlp, scale_mlp, EPS_MLP)
        if i + 1 < len(blocks):
            shift, scale, eps = chunks[i + 1][0], chunks[i + 1][1], EPS_ATTN
        else:
            shift, scale, eps = shift_out, scale_out, EPS_OUT
        x, h = ops.residual_norm_modulate(x, gate_mlp, block.mlp(h), shift, scale, eps)
    out = self.proj_out_2(h)
    c = self.shape.out_channels
    out = out.reshape(batch, grid, grid, p, p, c).permute(0, 5, 1, 3, 2, 4).reshape(batch, c, grid * p, grid * p)
    return FastOutput(sample=out) if return_dict else (out,)


def with_seam(model):
    """``model`` (a ``GraphedDiT`` or ``FastDiT``) with its FastDiT running ``seam_forward``."""
    base = getattr(model, "model", model)
    base.forward = types.MethodType(seam_forward, base)
    return model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch

    from dit_impl.baseline import load_model
    from dit_impl.fast import FastOptions, fast_transformer
    from pytest_ditgate.bench.runner import measure_pair
    from pytest_ditgate.quality.metrics import rel_l2

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    transformer = load_model("dit-xl-2-256", seed=args.seed, dtype="bfloat16", device="cuda").transformer
    generator = torch.Generator().manual_seed(args.seed + 1)
    half = torch.randn(args.images, 4, 32, 32, generator=generator)
    x = torch.cat([half, half]).cuda().bfloat16()
    t = torch.full((2 * args.images,), 500, dtype=torch.long, device="cuda")
    labels = torch.randint(0, 1000, (args.images,), generator=generator)
    y = torch.cat([labels, torch.full((args.images,), 1000)]).cuda()
    reference = type(transformer)(**transformer.config).to("cuda").eval().requires_grad_(False)
    reference.load_state_dict({k: v.float() for k, v in transformer.state_dict().items()})
    with torch.inference_mode():
        expected = reference(x.float(), timestep=t, class_labels=y).sample
    del reference
    torch.cuda.empty_cache()

    options = FastOptions.parse(FASTEST, FastOptions(dtype="bfloat16"))
    stock = fast_transformer(transformer, options)
    seam = with_seam(fast_transformer(transformer, options))
    with torch.inference_mode():
        out_stock = stock(x, timestep=t, class_labels=y).sample
        out_seam = seam(x, timestep=t, class_labels=y).sample
    log("[seam] captured both graphs; adaLN:", seam.model.report()["adaln"])
    comparison = measure_pair(seam.replay, stock.replay, mechanism="events", warmup=10, rounds=args.rounds,
                              labels=("seam", "stock"))
    result = {
        "switches": FASTEST, "images": args.images, "batch": 2 * args.images,
        "adaln": seam.model.report()["adaln"],
        "seam_ms": comparison.a.median_ms, "stock_ms": comparison.b.median_ms,
        "ratio": comparison.ratio, "ratio_interval": [comparison.ci_low, comparison.ci_high],
        "comparison": comparison.describe(),
        "seam_rel_l2_vs_fp32": rel_l2(out_seam, expected), "stock_rel_l2_vs_fp32": rel_l2(out_stock, expected),
        "seam_vs_stock_max_abs": float((out_seam.float() - out_stock.float()).abs().max()),
        "timer": f"pytest_ditgate.measure_pair, mechanism events around one graph replay, {args.rounds} rounds",
        "environment": environment(),
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, default=str))
    print(f"{'forward':<8} {'median ms':>10} {'rel-L2 vs fp32':>15}")
    print(f"{'stock':<8} {result['stock_ms']:>10.3f} {result['stock_rel_l2_vs_fp32']:>15.3e}")
    print(f"{'seam':<8} {result['seam_ms']:>10.3f} {result['seam_rel_l2_vs_fp32']:>15.3e}")
    low, high = result["ratio_interval"]
    print(f"seam / stock {result['ratio']:.4f} [{low:.4f}, {high:.4f}]; max |seam - stock| "
          f"{result['seam_vs_stock_max_abs']:.3e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
