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

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import log  # noqa: E402

TOKENS, IMAGES, HIDDEN = 256, 16, 1152
M = TOKENS * IMAGES
#: case -> (N, K, epilogue)
CASES = {
    "fc1+gelu": (4 * HIDDEN, HIDDEN, "gelu"),
    "qkv": (3 * HIDDEN, HIDDEN, "bias"),
    "attn_out": (HIDDEN, HIDDEN, "bias"),
    "fc2": (HIDDEN, 4 * HIDDEN, "bias"),
    "attn_out+res": (HIDDEN, HIDDEN, "residual"),
    "fc2+res": (HIDDEN, 4 * HIDDEN, "residual"),
}
GEMM_PEAK_TFLOPS = 800.0  # the h200 device profile's measured bf16 torch.matmul peak


def operands(n: int, k: int, seed: int):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(M, k, device="cuda", generator=g).bfloat16()
    w = (torch.randn(n, k, device="cuda", generator=g) / k ** 0.5).bfloat16()
    bias = (torch.randn(n, device="cuda", generator=g) * 0.1).bfloat16()
    residual = torch.randn(M, n, device="cuda", generator=g).bfloat16()
    return a, w, bias, residual


def calls(epilogue: str, a, w, bias, residual, tuned: bool):
    """(quack call, cuBLAS call, float32 expected) for one case."""
    import torch
    import torch.nn.functional as F
    from quack.gemm_interface import gemm, gemm_act, gemm_add

    b = w.t()  # (K, N), K-major: nn.Linear's weight as quack's B
    y = F.linear(a.float(), w.float(), bias.float())
    if epilogue == "gelu":
        return (lambda: gemm_act(a, b, bias=bias, activation="gelu_tanh_approx", store_preact=False,
                                 tuned=tuned)[1],
                lambda: torch._addmm_activation(bias, a, b, use_gelu=True),
                F.gelu(y, approximate="tanh"))
    if epilogue == "residual":
        return (lambda: gemm_add(a, b, residual, bias=bias, tuned=tuned),
                lambda: torch.add(F.linear(a, w, bias), residual),
                y + residual.float())
    return lambda: gemm(a, b, bias=bias, tuned=tuned), lambda: F.linear(a, w, bias), y


def rel_l2(got, want) -> float:
    return float((got.float() - want).norm() / want.norm())


def run_case(name: str, tuned: bool, rounds: int, results: list[dict]) -> None:
    import torch

    from pytest_ditgate.bench.runner import measure_pair

    n, k, epilogue = CASES[name]
    entry = {"case": name, "m": M, "n": n, "k": k, "epilogue": epilogue, "tuned": tuned}
    results.append(entry)
    try:
        a, w, bias, residual = operands(n, k, len(results))
        quack_call, cublas_call, want = calls(epilogue, a, w, bias, residual, tuned)
        start = time.perf_counter()
        got = quack_call()
        torch.cuda.synchronize()
        entry["first_call_s"] = round(time.perf_counter() - start, 2)
        entry["rel_l2"], entry["cublas_rel_l2"] = rel_l2(got, want), rel_l2(cublas_call(), want)
        if not entry["rel_l2"] <= max(4 * entry["cublas_rel_l2"], 1e-2):
            entry["error"] = f"wrong result: rel-L2 {entry['rel_l2']:.3e} (cuBLAS {entry['cublas_rel_l2']:.3e})"
            log(f"[quack] {name}: {entry['error']}")
            return
        for mechanism in ("graph", "events"):  # events if the DSL's launch cannot be captured
            try:
                pair = measure_pair(quack_call, cublas_call, mechanism=mechanism, warmup=10, rounds=rounds,
                                    labels=("quack", "cublas"))
                break
            except Exception as exc:  # noqa: BLE001
                entry[f"{mechanism}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        else:
            raise RuntimeError("neither the graph nor the events timer could time it")
        flops = 2.0 * M * n * k
        entry.update(mechanism=mechanism, quack_ms=pair.a.median_ms, cublas_ms=pair.b.median_ms, ratio=pair.ratio,
                     ratio_interval=[pair.ci_low, pair.ci_high], quack_tflops=flops / pair.a.median_ms / 1e9,
                     cublas_tflops=flops / pair.b.median_ms / 1e9)
        log(f"[quack] {name} tuned={tuned}: {pair.describe()}")
    except Exception as exc:  # noqa: BLE001 - one case failing must not lose the others
        entry["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
        log(f"[quack] {name}: {entry['error']}")


def table(results: list[dict]) -> list[str]:
    lines = [f"{'case':<13} {'tuned':<5} {'quack ms':>9} {'cuBLAS ms':>9} {'ratio':>7} {'95% interval':>15} "
             f"{'quack TF/s':>10} {'cuBLAS TF/s':>11} {'rel-L2':>9}"]
    for e in results:
        head = f"{e['case']:<13} {str(e['tuned']):<5}"
        if "quack_ms" not in e:
            lines.append(f"{head} {e.get('error', 'not run')[:90]}")
            continue
        low, high = e["ratio_interval"]
        lines.append(f"{head} {e['quack_ms']:>9.4f} {e['cublas_ms']:>9.4f} {e['ratio']:>7.3f} "
                     f"{f'{low:.3f}-{high:.3f}':>15} {e['quack_tflops']:>10.0f} {e['cublas_tflops']:>11.0f} "
                     f"{e['rel_l2']:>9.2e}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--tuned", action="store_true", help="also time quack's autotuned configurations")
    args = parser.parse_args()

    import torch

    import quack

    torch.backends.cuda.matmul.allow_tf32 = False
    results: list[dict] = []
    for tuned in ((False, True) if args.tuned else (False,)):
        for name in args.cases.split(","):
            run_case(name, tuned, args.rounds, results)
            if args.out:  # written after every case: a killed run keeps what it measured
                args.out.write_text(json.dumps({"results": results, "environment": {
                    "torch": torch.__version__, "quack": getattr(quack, "__version__", "?"),
                    "device": torch.cuda.get_device_name(), "arch": "sm_%d%d" % torch.cuda.get_device_capability()},
                    "timer": "pytest_ditgate measure_pair, interleaved rounds (mechanism per case)"}, indent=1))
    print("\n".join(table(results)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
