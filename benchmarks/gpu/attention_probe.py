"""Where does DiT-XL/2's attention lose its time, and would another head layout win it back? (issue 18)

The fast forward's attention (16 images x 16 heads x 256 tokens x head dim 72, bf16) runs at about
190 TFLOP/s in cuDNN, 0.70 ms a forward. ``docs/dit_forward_budget.md`` puts about 0.3 ms within reach.
This probe times the candidates side by side, each against the model's own call (cuDNN on the strided
q/k/v views the fused QKV projection leaves), before any model code changes:

- the backends (cuDNN, flash, memory-efficient) on the same strided views, and cuDNN on contiguous copies;
- head dim padded with zeros to 80, 96 and 128 with the softmax scale kept at 1/sqrt(72) (exact: zero
  columns add nothing to q.k, and the output's padding is sliced off). In the model the padding would be
  free (zero rows in the QKV weight, zero columns in attention-out's), at the cost the table's GEMM line
  states; here the padded inputs are made once, outside the timed call.

    python benchmarks/gpu/attention_probe.py --out results.json

Every variant is checked against float32 attention first; times are medians of ``pytest_ditgate``'s CUDA-
graph timer, candidate and the model's call interleaved round by round. A table is printed last.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import check_result, environment, log, one_case  # noqa: E402

BATCH, HEADS, TOKENS, HEAD_DIM = 16, 16, 256, 72
FLOPS = 4.0 * BATCH * HEADS * TOKENS * TOKENS * HEAD_DIM  # QK^T and PV, at the true head dim
LAYERS = 28


def backend_enum(name: str):
    from torch.nn.attention import SDPBackend

    return {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[name]


def attention_call(backend: str, q, k, v, scale: float, keep: int):
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    chosen = backend_enum(backend)

    def call():
        with sdpa_kernel(chosen):
            out = F.scaled_dot_product_attention(q, k, v, scale=scale)
        return out[..., :keep] if out.shape[-1] != keep else out

    return call


def padded(t, width: int):
    import torch.nn.functional as F

    return F.pad(t, (0, width - t.shape[-1])).contiguous()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=100)
    args = parser.parse_args()

    import torch

    from pytest_ditgate.bench.runner import measure_pair
    from pytest_ditgate.quality.metrics import rel_l2

    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn(BATCH, TOKENS, 3, HEADS, HEAD_DIM, device="cuda", generator=g).bfloat16()
    q, k, v = qkv.permute(2, 0, 3, 1, 4)  # the model's strided views, [B, H, S, D]
    scale = HEAD_DIM ** -0.5
    want = torch.softmax(q.float() @ k.float().transpose(-1, -2) * scale, dim=-1) @ v.float()
    model_call = attention_call("cudnn", q, k, v, scale, HEAD_DIM)

    variants = {f"{name} strided": attention_call(name, q, k, v, scale, HEAD_DIM)
                for name in ("cudnn", "flash", "efficient")}
    contiguous = [t.contiguous() for t in (q, k, v)]
    variants["cudnn contiguous"] = attention_call("cudnn", *contiguous, scale, HEAD_DIM)
    variants["flash contiguous"] = attention_call("flash", *contiguous, scale, HEAD_DIM)
    for width in (80, 96, 128):
        pads = [padded(t, width) for t in (q, k, v)]
        for name in ("cudnn", "flash"):
            variants[f"{name} padded to {width}"] = attention_call(name, *pads, scale, HEAD_DIM)

    results = []
    for label, call in variants.items():
        entry = {"variant": label}
        results.append(entry)
        with one_case(entry, "attention", label):  # a backend that cannot run the shape is a result too
            entry["rel_l2"] = rel_l2(call(), want)
            check_result(entry["rel_l2"], 2e-2, "float32 attention")
            pair = measure_pair(call, model_call, mechanism="graph", warmup=10, rounds=args.rounds,
                                labels=(label, "model"))
            entry.update(ms=pair.a.median_ms, model_ms=pair.b.median_ms, ratio=pair.ratio,
                         ratio_interval=[pair.ci_low, pair.ci_high], tflops=FLOPS / pair.a.median_ms / 1e9,
                         forward_ms_saved=(pair.b.median_ms - pair.a.median_ms) * LAYERS)
            log(f"[attention] {pair.describe()}")
    record = {"shape": {"batch": BATCH, "heads": HEADS, "tokens": TOKENS, "head_dim": HEAD_DIM}, "results": results,
              "timer": "pytest_ditgate measure_pair, mechanism graph, interleaved with the model's call",
              "environment": environment()}
    if args.out:
        args.out.write_text(json.dumps(record, indent=1, default=str))
    print(f"{'variant':<22} {'ms':>8} {'model ms':>9} {'ratio':>7} {'TFLOP/s':>8} {'ms/forward':>10} {'rel-L2':>9}")
    for e in results:
        if "ms" not in e:
            print(f"{e['variant']:<22} {e.get('error', 'not run')[:80]}")
            continue
        print(f"{e['variant']:<22} {e['ms']:>8.4f} {e['model_ms']:>9.4f} {e['ratio']:>7.3f} {e['tflops']:>8.0f} "
              f"{-e['forward_ms_saved']:>+10.3f} {e['rel_l2']:>9.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
