"""Do CuTe-DSL GEMMs (quack-kernels) beat cuBLAS at the DiT block's shapes, epilogues included? (issue 18)

The Triton probe (``gemm_epilogue_probe.py``) found Triton 50 to 70 % of the GEMM peak where cuBLAS runs at
76 to 82 %, so fusing epilogues there loses more than it saves. quack-kernels writes warp-specialised
Hopper GEMMs in NVIDIA's CuTe DSL with fused epilogues: bias, an activation (GELU tanh among them) and an
addend ``C`` (a residual). At M = 4096 tokens (16 images x 256), bf16, this times side by side:

- bias only (QKV, attention-out, fc2): ``quack.gemm`` against ``F.linear``;
- fc1 with GELU: ``quack.gemm_act`` against cuBLASLt's GELU epilogue (``torch._addmm_activation``), which
  costs cuBLAS about 10 points of efficiency;
- attention-out and fc2 with a residual addend: ``quack.gemm_add`` against ``F.linear`` + add (the lower
  bound of the gated residual, whose per-(image, channel) gate quack's epilogues do not carry).

Setup on the offline GPU machine: ``benchmarks/gpu/stage_quack.sh`` (three calls), then

    PYTHONPATH=/tmp/quack/site-packages:/tmp/quack/site-packages/nvidia_cutlass_dsl/dsl_packages \
        python3 benchmarks/gpu/quack_gemm_probe.py --out results.json [--tuned]

Every case is checked against float32 first; times are medians of ``pytest_ditgate``'s CUDA-graph timer
with quack and cuBLAS interleaved round by round. A table is printed last.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import check_result, log, one_case  # noqa: E402

from block_gemms import (ATTN_OUT, FC1, FC2, QKV, expected, measure_graph_or_events, of_peak, operands,  # noqa: E402
                         quack_probe_main, tflops)

#: case -> (N, K, epilogue)
CASES = {"fc1+gelu": (*FC1, "gelu"), "qkv": (*QKV, "bias"), "attn_out": (*ATTN_OUT, "bias"),
         "fc2": (*FC2, "bias"), "attn_out+res": (*ATTN_OUT, "residual"), "fc2+res": (*FC2, "residual")}


def calls(epilogue: str, a, w, bias, residual, tuned: bool):
    """(quack call, cuBLAS call) for one case."""
    import torch
    import torch.nn.functional as F
    from quack.gemm_interface import gemm, gemm_act, gemm_add

    b = w.t()  # (K, N), K-major: nn.Linear's weight as quack's B
    if epilogue == "gelu":
        return (lambda: gemm_act(a, b, bias=bias, activation="gelu_tanh_approx", store_preact=False,
                                 tuned=tuned)[1],
                lambda: torch._addmm_activation(bias, a, b, use_gelu=True))
    if epilogue == "residual":
        return (lambda: gemm_add(a, b, residual, bias=bias, tuned=tuned),
                lambda: torch.add(F.linear(a, w, bias), residual))
    return lambda: gemm(a, b, bias=bias, tuned=tuned), lambda: F.linear(a, w, bias)


def run_case(name: str, tuned: bool, rounds: int, results: list[dict]) -> None:
    import torch

    from pytest_ditgate.quality.metrics import rel_l2

    n, k, epilogue = CASES[name]
    entry = {"case": name, "n": n, "k": k, "epilogue": epilogue, "tuned": tuned}
    results.append(entry)
    with one_case(entry, "quack", f"{name} tuned={tuned}"):
        ops = operands(n, k, seed=len(results))
        ops.pop("gate")  # no quack epilogue carries a per-image gate
        want = expected(epilogue, **ops, gate=None)
        quack_call, cublas_call = calls(epilogue, **ops, tuned=tuned)
        start = time.perf_counter()
        got = quack_call()
        torch.cuda.synchronize()
        entry["first_call_s"] = round(time.perf_counter() - start, 2)
        entry["rel_l2"], entry["cublas_rel_l2"] = rel_l2(got, want), rel_l2(cublas_call(), want)
        check_result(entry["rel_l2"], max(4 * entry["cublas_rel_l2"], 1e-2),
                     f"float32 (cuBLAS {entry['cublas_rel_l2']:.3e})")
        pair = measure_graph_or_events(quack_call, cublas_call, rounds, ("quack", "cublas"), entry)
        entry.update(mechanism=pair.a.mechanism, quack_ms=pair.a.median_ms, cublas_ms=pair.b.median_ms,
                     ratio=pair.ratio,
                     ratio_interval=[pair.ci_low, pair.ci_high], quack_tflops=tflops(n, k, pair.a.median_ms),
                     cublas_tflops=tflops(n, k, pair.b.median_ms))
        log(f"[quack] {name} tuned={tuned}: {pair.describe()}")


def table(results: list[dict], peak: float | None) -> list[str]:
    """One row per case; ``of peak`` is quack's rate against the device profile's measured bf16 GEMM peak."""
    lines = [f"{'case':<13} {'tuned':<5} {'quack ms':>9} {'cuBLAS ms':>9} {'ratio':>7} {'95% interval':>15} "
             f"{'quack TF/s':>10} {'of peak':>7} {'cuBLAS TF/s':>11} {'rel-L2':>9}"]
    for e in results:
        head = f"{e['case']:<13} {str(e['tuned']):<5}"
        if "quack_ms" not in e:
            lines.append(f"{head} {e.get('error', 'not run')[:90]}")
            continue
        low, high = e["ratio_interval"]
        lines.append(f"{head} {e['quack_ms']:>9.4f} {e['cublas_ms']:>9.4f} {e['ratio']:>7.3f} "
                     f"{f'{low:.3f}-{high:.3f}':>15} {e['quack_tflops']:>10.0f} {of_peak(e['quack_tflops'], peak):>7} "
                     f"{e['cublas_tflops']:>11.0f} {e['rel_l2']:>9.2e}")
    return lines


def main() -> int:
    return quack_probe_main(__doc__.splitlines()[0], CASES, run_case, table)


if __name__ == "__main__":
    raise SystemExit(main())
