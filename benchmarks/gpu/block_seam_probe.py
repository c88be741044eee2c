"""Is fusing the seam between two DiT blocks worth a lane experiment? (issue 18)

The fast forward runs three adaLN kernels per block: LayerNorm + modulate before attention, the fused
gated residual + LayerNorm + modulate between attention and MLP, and a lone gated residual after the MLP;
after the last block, PyTorch ops apply the output LayerNorm and modulation. The fused kernel can also
close each block: block i's MLP residual and block i+1's pre-attention LayerNorm are one
``residual_norm_modulate`` (the last block's with the output shift and scale). That leaves one lone
``norm_modulate`` in the whole forward and removes 27 kernels, the output LayerNorm's PyTorch ops and their
graph gaps.

That forward is the fast DiT's ``block_seam`` switch. This probe measures it side by side with the stock
fastest forward, both as CUDA graphs, interleaved round by round:

    python benchmarks/gpu/block_seam_probe.py --out results.json

It prints a table last: median ms of each, the paired ratio with its 95 % interval, rel-L2 of each against
the float32 diffusers forward, and the largest difference between the two.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import environment, log  # noqa: E402

from dit_bench import FASTEST  # noqa: E402
from xl_forward import case_arguments, xl_case  # noqa: E402


def main() -> int:
    parser = case_arguments(__doc__.splitlines()[0])
    args = parser.parse_args()

    from dit_impl.fast import FastOptions, fast_transformer
    from pytest_ditgate.bench.runner import measure_pair
    from pytest_ditgate.quality.metrics import rel_l2

    case = xl_case(args.images, args.seed)
    transformer, expected = case.transformer, case.expected
    options = FastOptions.parse(FASTEST, FastOptions(dtype="bfloat16"))
    stock = fast_transformer(transformer, options)
    seam = fast_transformer(transformer, options.replace(block_seam=True))
    out_stock, out_seam = case.run(stock), case.run(seam)
    log("[seam] captured both graphs; adaLN:", seam.model.report()["adaln"])
    comparison = measure_pair(seam.replay, stock.replay, mechanism="events", warmup=10, rounds=args.rounds,
                              labels=("seam", "stock"))
    result = {
        "switches": FASTEST, "seam_switches": f"{FASTEST},block_seam=1", "images": args.images, "batch": 2 * args.images,
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
