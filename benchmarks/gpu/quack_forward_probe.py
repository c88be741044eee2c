"""Is the DiT-XL/2 forward faster with quack's CuTe-DSL GEMMs for fc1 (+GELU) and QKV? (issue 18)

``quack_gemm_probe.py`` timed the block's GEMMs alone (``benchmarks/results/quack_gemm_sm_90.txt``): quack's
GELU-epilogue GEMM ran fc1 at 0.77x of cuBLASLt's GELU epilogue, QKV at 0.93x of cuBLAS; attention-out and
fc2 stay faster in cuBLAS. Isolated GEMM times carry each replay's launch, so this probe measures what the
forward itself gains. Every variant is the fastest forward with the block seam (``FASTEST,block_seam=1``),
captured as a CUDA graph; in each block the variant swaps

- ``fc1``: the MLP's first GEMM and its GELU(tanh) for quack's ``gemm_act`` (one kernel, bias and GELU in
  its epilogue);
- ``fc1+qkv``: also the fused QKV projection for quack's ``gemm`` with its bias.

Nothing in ``dit_impl`` changes: the probe replaces the blocks' modules and MLP on the built model, before
its graph is captured. Each variant is checked against the float32 diffusers forward (its rel-L2 beside the
stock forward's), then timed against the stock forward side by side, interleaved round by round.

    PYTHONPATH=/tmp/site:/tmp/quack/site-packages:/tmp/quack/site-packages/nvidia_cutlass_dsl/dsl_packages \\
        python3 benchmarks/gpu/quack_forward_probe.py --out results.json [--tuned]

quack comes from ``benchmarks/gpu/stage_quack.sh`` (three calls); diffusers, for the float32 reference, from
``.whl`` in a fourth call while the machine is still warm (a staged part, the wheels and the tree together
would pass the 64 MiB a call may carry), installed into ``/tmp/site`` as for the GPU check.

A table is printed last: median ms, ratio to stock with its 95 % interval, the forward's matmul TFLOP/s and
its share of the device profile's GEMM peak; with ``--profile``, the phase table of one traced replay of the
stock forward and of each variant.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import check_result, environment, gemm_peak_tflops, log, one_case, phase_profile, phase_table  # noqa: E402

from xl_forward import FASTEST, case_arguments, xl_case  # noqa: E402

#: variant -> the block GEMMs it hands to quack
VARIANTS = {"fc1": ("fc1",), "fc1+qkv": ("fc1", "qkv")}


def quack_linear(linear: Any, tuned: bool, activation: str | None = None) -> Any:
    """``linear`` (an ``nn.Linear``) as a quack GEMM with the bias, and ``activation``, in its epilogue."""
    from torch import nn

    from quack.gemm_interface import gemm, gemm_act

    class QuackLinear(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = linear

        def forward(self, x: Any) -> Any:
            flat = x.reshape(-1, x.shape[-1])
            b = self.linear.weight.t()  # (K, N), K-major: the weight as quack's B, no copy
            if activation is None:
                out = gemm(flat, b, bias=self.linear.bias, tuned=tuned)
            else:
                out = gemm_act(flat, b, bias=self.linear.bias, activation=activation, store_preact=False,
                               tuned=tuned)[1]
            return out.view(*x.shape[:-1], out.shape[-1])

    return QuackLinear()


def use_quack(model: Any, gemms: tuple[str, ...], tuned: bool) -> None:
    """Swap ``gemms`` of every block of the ``FastDiT`` ``model`` for quack's, before graph capture."""
    for block in model.transformer_blocks:
        if "qkv" in gemms:
            if not block.fused_qkv:
                raise ValueError("the qkv swap needs fused_qkv=1")
            block.qkv = quack_linear(block.qkv, tuned)
        if "fc1" in gemms:
            fc1_gelu = quack_linear(block.fc1, tuned, activation="gelu_tanh_approx")
            block.mlp = lambda x, block=block, fc1_gelu=fc1_gelu: block.fc2(fc1_gelu(x))


def main() -> int:
    parser = case_arguments(__doc__.splitlines()[0])
    parser.add_argument("--tuned", action="store_true", help="quack's autotuned configurations")
    parser.add_argument("--profile", action="store_true",
                        help="a phase profile of the stock forward and each variant (one traced replay, after timing)")
    args = parser.parse_args()

    import quack
    import torch

    from dit_bench import forward_flops
    from dit_impl.fast import FastOptions, fast_transformer
    from pytest_ditgate.bench.runner import measure_pair
    from pytest_ditgate.quality.metrics import rel_l2

    case = xl_case(args.images, args.seed)
    peak, peak_source = gemm_peak_tflops()
    shape = case.transformer.config
    flops = forward_flops({"tokens": (shape.sample_size // shape.patch_size) ** 2, "layers": shape.num_layers,
                           "hidden": shape.num_attention_heads * shape.attention_head_dim, "x": list(case.x.shape)})
    switches = f"{FASTEST},block_seam=1"
    options = FastOptions.parse(switches, FastOptions(dtype="bfloat16"))
    stock = fast_transformer(case.transformer, options)
    stock_rel_l2 = rel_l2(case.run(stock), case.expected)
    results: list[dict[str, Any]] = []
    record = {"switches": switches, "images": args.images, "batch": 2 * args.images, "tuned": args.tuned,
              "quack": getattr(quack, "__version__", "?"), "forward_flops": flops, "gemm_peak_tflops": peak,
              "gemm_peak_source": peak_source, "stock_rel_l2_vs_fp32": stock_rel_l2, "results": results,
              "timer": f"pytest_ditgate.measure_pair, events around one graph replay, {args.rounds} rounds",
              "environment": environment()}
    for name, gemms in VARIANTS.items():
        entry: dict[str, Any] = {"variant": name, "gemms": list(gemms)}
        results.append(entry)
        variant = None
        with one_case(entry, "quack forward", name):  # one variant failing must not lose the others
            variant = fast_transformer(case.transformer, options)
            use_quack(variant.model, gemms, args.tuned)
            out = case.run(variant)  # warms up (quack compiles here) and captures the graph
            entry["rel_l2_vs_fp32"] = rel_l2(out, case.expected)
            check_result(entry["rel_l2_vs_fp32"], 1.25 * stock_rel_l2, f"float32 (stock {stock_rel_l2:.3e})")
            pair = measure_pair(variant.replay, stock.replay, mechanism="events", warmup=10, rounds=args.rounds,
                                labels=(name, "stock"))
            entry.update(ms=pair.a.median_ms, stock_ms=pair.b.median_ms, ratio=pair.ratio,
                         ratio_interval=[pair.ci_low, pair.ci_high], comparison=pair.describe())
            log(f"[quack forward] {pair.describe()}")
            if args.profile:
                if "stock_profile" not in record:
                    record["stock_profile"] = traced(stock.replay, "stock", pair.b.median_ms, args.out)
                entry["profile"] = traced(variant.replay, name, pair.a.median_ms, args.out)
        variant = None
        torch.cuda.empty_cache()
        if args.out:  # rewritten after every variant: a later failure loses nothing
            args.out.write_text(json.dumps(record, indent=1, default=str))
    print("\n".join(table(results, stock_rel_l2, flops, peak)))
    if args.profile:
        print(phase_table([("stock", record.get("stock_profile"))] + [(e["variant"], e.get("profile"))
                                                                       for e in results]))
    return 0


def traced(replay: Any, label: str, timed_ms: float, out: Path | None) -> dict[str, Any]:
    """The phase profile of one traced graph replay, its trace under ``profiles/`` beside ``out``."""
    return phase_profile(replay, f"quack forward {label}", out.parent if out else Path.cwd(), "quack_forward_probe",
                         timed_ms)


def table(results: list[dict[str, Any]], stock_rel_l2: float, flops: float, peak: float | None) -> list[str]:
    """Stock's line (from the first timed pair) and one line per variant."""
    lines = [f"{'forward':<10} {'median ms':>9} {'ratio':>7} {'95% interval':>15} {'TFLOP/s':>8} {'of peak':>7} "
             f"{'rel-L2':>9}"]

    def rate(ms: float) -> str:
        tf = flops / (ms * 1e-3) / 1e12
        return f"{tf:>8.0f} {(f'{tf / peak:.0%}' if peak else '-'):>7}"

    timed = [e for e in results if "ms" in e]
    if timed:
        lines.append(f"{'stock':<10} {timed[0]['stock_ms']:>9.3f} {'1.000':>7} {'':>15} {rate(timed[0]['stock_ms'])} "
                     f"{stock_rel_l2:>9.2e}")
    for e in results:
        if "ms" not in e:
            lines.append(f"{e['variant']:<10} {e.get('error', 'not run')[:100]}")
            continue
        low, high = e["ratio_interval"]
        lines.append(f"{e['variant']:<10} {e['ms']:>9.3f} {e['ratio']:>7.3f} {f'{low:.3f}-{high:.3f}':>15} "
                     f"{rate(e['ms'])} {e['rel_l2_vs_fp32']:>9.2e}")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
