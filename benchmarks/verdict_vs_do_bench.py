#!/usr/bin/env python3
"""Benchmark: ditgate's speed verdict beside triton's ``do_bench`` ratio and the end-to-end truth, on pairs where
kernel time and latency disagree and on pairs where they agree (issue 47).

Pairs (bf16 on CUDA): the project's own kernels against eager PyTorch and ``torch.compile`` (LayerNorm +
modulate and the gated residual at the DiT shape 64x4096x1152), and a host-synchronising op of our own: a
cross-entropy-style loss whose candidate reads a value on the host between its kernels (``.item()``, as
Liger-Kernel's cross entropy does) against eager ``cross_entropy`` and its ``torch.compile``. For each pair,
side by side in one run:

- ditgate: ``measure_pair`` with mechanism auto (the latency), its ratio and interval, the busy-time ratio
  beside it, and ``ditbench.pair``'s verdict at ``min_speedup=0.05`` (pass or too_slow);
- ``measure_pair`` with ``mechanism="cupti"`` (kernel time only), the number that misled before;
- ``triton.testing.do_bench`` of each side, median, and their ratio;
- the end-to-end truth: the host clock around many back-to-back calls of each side with one synchronisation,
  per call, and their ratio.

Where ditgate's latency ratio and do_bench's differ by more than 5 %, the record says which is nearer the
end-to-end truth, and by how much (``which_is_right``). Writes ``verdict_vs_do_bench_<arch>.json`` (``--out``)
with the provenance (an ``environment`` record) and each number's timer; prints the table last.

Run: ``python benchmarks/verdict_vs_do_bench.py --out benchmarks/results``
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from harness import ROOT, end_to_end_ms, environment, guarded, log  # noqa: E402 - puts the repository on sys.path

MIN_SPEEDUP = 0.05
DISAGREE = 0.05


def syncing_cross_entropy(logits: Any, target: Any) -> Any:
    """A loss that reads its normaliser on the host between its kernels (one ``.item()``), as a kernel library
    that sizes its launch from a device value would: fewer bytes moved than eager, and a host wait."""
    import torch

    peak = logits.max(dim=-1, keepdim=True).values
    total = float(peak.float().abs().max().item())  # the host reads a value: copy + synchronise
    shifted = logits - peak
    loss = torch.logsumexp(shifted.float(), dim=-1) - shifted.gather(-1, target[:, None]).squeeze(-1).float()
    return loss.mean() + 0.0 * total


def eager_cross_entropy(logits: Any, target: Any) -> Any:
    import torch.nn.functional as F

    return F.cross_entropy(logits.float(), target)


def make_pairs() -> list[dict[str, Any]]:
    import torch

    import kernels
    from kernels.reference import gated_residual_ref, layernorm_modulate_ref

    dev, bf = "cuda", torch.bfloat16
    x = torch.randn(64, 4096, 1152, device=dev, dtype=bf)
    y = torch.randn_like(x)
    scale = torch.randn(64, 1152, device=dev, dtype=bf) * 0.1
    shift = torch.randn_like(scale) * 0.1
    gate = torch.randn_like(scale)
    logits = torch.randn(4096, 32000, device=dev, dtype=bf)
    target = torch.randint(0, 32000, (4096,), device=dev)
    compiled_ln = torch.compile(layernorm_modulate_ref, dynamic=False)
    compiled_gr = torch.compile(gated_residual_ref, dynamic=False)
    compiled_ce = torch.compile(eager_cross_entropy, dynamic=False)
    return [
        {"name": "layernorm_modulate vs eager", "candidate": kernels.layernorm_modulate,
         "reference": layernorm_modulate_ref, "args": (x, scale, shift)},
        {"name": "layernorm_modulate vs torch.compile", "candidate": kernels.layernorm_modulate,
         "reference": compiled_ln, "args": (x, scale, shift)},
        {"name": "gated_residual vs eager", "candidate": kernels.gated_residual, "reference": gated_residual_ref,
         "args": (x, gate, y)},
        {"name": "gated_residual vs torch.compile", "candidate": kernels.gated_residual, "reference": compiled_gr,
         "args": (x, gate, y)},
        {"name": "syncing cross entropy vs eager", "candidate": syncing_cross_entropy,
         "reference": eager_cross_entropy, "args": (logits, target)},
        {"name": "syncing cross entropy vs torch.compile", "candidate": syncing_cross_entropy,
         "reference": compiled_ce, "args": (logits, target)},
    ]


def one_pair(pair: dict[str, Any]) -> dict[str, Any]:
    import triton.testing as tt

    from pytest_ditgate.bench import measure_pair

    candidate, reference, args = pair["candidate"], pair["reference"], pair["args"]
    for fn in (candidate, reference):  # compile and build before anything is timed
        for _ in range(3):
            fn(*args)
    latency = measure_pair(candidate, reference, *args)
    kernel = measure_pair(candidate, reference, *args, mechanism="cupti")
    bench = [float(tt.do_bench(lambda fn=fn: fn(*args), return_mode="median")) for fn in (candidate, reference)]
    truth = [end_to_end_ms(lambda fn=fn: fn(*args), 50.0) for fn in (candidate, reference)]
    row = {
        "ditgate": {"mechanism": latency.a.mechanism, "ratio": latency.ratio, "ci": [latency.ci_low, latency.ci_high],
                    "busy_ratio": latency.busy_ratio, "verdict": "pass" if latency.faster_by_at_least(MIN_SPEEDUP)
                    else "too_slow", "line": latency.describe(), "disagreement": latency.disagreement(MIN_SPEEDUP),
                    "candidate_extra": latency.a.extra, "reference_extra": latency.b.extra},
        "cupti": {"ratio": kernel.ratio, "ci": [kernel.ci_low, kernel.ci_high],
                  "verdict": "pass" if kernel.faster_by_at_least(MIN_SPEEDUP) else "too_slow"},
        "do_bench": {"candidate_ms": bench[0], "reference_ms": bench[1], "ratio": bench[0] / bench[1]},
        "end_to_end": {"candidate_ms": truth[0], "reference_ms": truth[1], "ratio": truth[0] / truth[1]},
    }
    ours, theirs, real = row["ditgate"]["ratio"], row["do_bench"]["ratio"], row["end_to_end"]["ratio"]
    if abs(ours / theirs - 1) > DISAGREE:
        off_ours, off_theirs = abs(ours / real - 1), abs(theirs / real - 1)
        row["which_is_right"] = (f"{'ditgate' if off_ours < off_theirs else 'do_bench'} is nearer the end-to-end "
                                 f"ratio {real:.4f}: ditgate {ours:.4f} ({off_ours:.1%} off), do_bench {theirs:.4f} "
                                 f"({off_theirs:.1%} off)")
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ns = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        log("verdict_vs_do_bench needs a CUDA GPU")
        return 2
    results: dict[str, Any] = {"benchmark": "verdict_vs_do_bench", "provenance": environment(),
                               "timers": {"ditgate": "pytest_ditgate.measure_pair, mechanism auto (latency: batched "
                                                     "CUDA events) and cupti", "do_bench": "triton.testing.do_bench "
                                                     "(CUDA events per call, queued), median",
                                          "end_to_end": "time.perf_counter around back-to-back calls, one "
                                                        "torch.cuda.synchronize"},
                               "min_speedup": MIN_SPEEDUP, "pairs": {}}
    for pair in make_pairs():
        log(f"== {pair['name']}")
        guarded(results["pairs"], pair["name"], lambda: one_pair(pair))
    arch = results["provenance"]["device"].get("arch", "unknown")
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"verdict_vs_do_bench_{arch}.json"
    path.write_text(json.dumps(results, indent=1, default=str) + "\n")
    log(f"wrote {path}")
    print(f"\n{'pair':40s} {'ditgate':>8s} {'busy':>7s} {'cupti':>7s} {'do_bench':>8s} {'e2e':>7s}  verdict")
    missed = []
    for name, row in results["pairs"].items():
        if not isinstance(row, dict) or "ditgate" not in row:
            print(f"{name:40s} error: {row}")
            missed.append(name)
            continue
        d, busy = row["ditgate"], row["ditgate"]["busy_ratio"]
        print(f"{name:40s} {d['ratio']:8.4f} {busy if busy is not None else float('nan'):7.4f} "
              f"{row['cupti']['ratio']:7.4f} {row['do_bench']['ratio']:8.4f} {row['end_to_end']['ratio']:7.4f}  "
              f"{d['verdict']} (cupti: {row['cupti']['verdict']})")
        if row.get("which_is_right"):
            print(f"{'':40s} {row['which_is_right']}")
    ratios = [abs(r["ditgate"]["ratio"] / r["end_to_end"]["ratio"] - 1) for r in results["pairs"].values()
              if isinstance(r, dict) and "ditgate" in r]
    if ratios:
        print(f"ditgate's latency ratio against the end-to-end ratio: median {statistics.median(ratios):.1%} off, "
              f"worst {max(ratios):.1%}")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
