"""Can a Triton GEMM carry the DiT block's elementwise work and keep cuBLAS's speed? (issue 18)

``docs/dit_forward_budget.md`` finds the 6.0 ms forward needs the GEMMs to absorb the elementwise kernels:
GELU in fc1's epilogue without cuBLAS's loss of efficiency there, and the per-(image, channel) gated
residual ``x + gate * (A @ W.T + b)`` in the epilogues of attention-out and fc2, which cuBLAS epilogues
cannot express. This probe answers the first question of that project before any model code changes: at
the four GEMM shapes of a DiT-XL/2 block at batch 16 (M = 4096 tokens), how fast is a TMA Triton GEMM with
each epilogue, against what the fast forward runs today (cuBLAS, plus the lone gated-residual kernel)?

Two kernels, each timed at a few tile configurations: one tile per program, and persistent (one program per
SM walking the tiles). Every case is checked against a float32 reference first; times are medians of
``pytest_ditgate``'s CUDA-graph timer, candidate and cuBLAS interleaved round by round.

    python benchmarks/gpu/gemm_epilogue_probe.py --out results.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import check_result, gemm_peak_tflops, log, one_case  # noqa: E402

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from block_gemms import (ATTN_OUT, FC1, FC2, IMAGES, QKV, TOKENS, expected, of_peak, operands, tflops,  # noqa: E402
                         write_record)

#: name -> (N, K, epilogue): the GEMMs of one block
SHAPES = {"qkv": (*QKV, "bias"), "attn_out": (*ATTN_OUT, "gated"), "fc1": (*FC1, "gelu"), "fc2": (*FC2, "gated")}
EPILOGUES = {"bias": 0, "gelu": 1, "gated": 2}
#: (BLOCK_M, BLOCK_N, BLOCK_K, stages, warps)
CONFIGS = [(128, 256, 64, 3, 8), (128, 128, 64, 4, 8), (256, 128, 64, 3, 8), (128, 64, 64, 4, 4)]


@triton.jit
def _epilogue(acc, off_m, off_n, N, bias_ptr, gate_ptr, gate_stride, res_desc,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EPILOGUE: tl.constexpr, TOKENS_PER_IMAGE: tl.constexpr):
    cols = off_n + tl.arange(0, BLOCK_N)
    acc = acc + tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    if EPILOGUE == 1:  # GELU, tanh approximation (tanh(u) = 2 sigmoid(2u) - 1)
        inner = 0.7978845608028654 * (acc + 0.044715 * acc * acc * acc)
        acc = acc * tl.sigmoid(2.0 * inner)
    if EPILOGUE == 2:  # x + gate[image] * y, the gate per (image, channel); the product rounded like diffusers
        rows = off_m + tl.arange(0, BLOCK_M)
        image = rows // TOKENS_PER_IMAGE
        gate = tl.load(gate_ptr + image[:, None] * gate_stride + cols[None, :], mask=cols[None, :] < N, other=0.0)
        product = (gate.to(tl.float32) * acc.to(tl.bfloat16).to(tl.float32)).to(tl.bfloat16)
        acc = res_desc.load([off_m, off_n]).to(tl.float32) + product.to(tl.float32)
    return acc.to(tl.bfloat16)


@triton.jit
def gemm_tile_kernel(a_desc, w_desc, c_desc, res_desc, bias_ptr, gate_ptr, gate_stride, M, N, K,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                     EPILOGUE: tl.constexpr, TOKENS_PER_IMAGE: tl.constexpr):
    """One output tile per program: C = epilogue(A @ W.T), A [M, K], W [N, K] (nn.Linear's layout)."""
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = min(tiles_m - first_m, GROUP_M)
    off_m = (first_m + (pid % per_group) % group_rows) * BLOCK_M
    off_n = ((pid % per_group) // group_rows) * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(tl.cdiv(K, BLOCK_K)):
        a = a_desc.load([off_m, k * BLOCK_K])
        w = w_desc.load([off_n, k * BLOCK_K])
        acc = tl.dot(a, w.T, acc)
    c_desc.store([off_m, off_n], _epilogue(acc, off_m, off_n, N, bias_ptr, gate_ptr, gate_stride, res_desc,
                                           BLOCK_M, BLOCK_N, EPILOGUE, TOKENS_PER_IMAGE))


@triton.jit
def gemm_persistent_kernel(a_desc, w_desc, c_desc, res_desc, bias_ptr, gate_ptr, gate_stride, M, N, K,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           GROUP_M: tl.constexpr, EPILOGUE: tl.constexpr, TOKENS_PER_IMAGE: tl.constexpr,
                           PROGRAMS: tl.constexpr):
    """The same GEMM with PROGRAMS programs, each walking tiles start, start + PROGRAMS, ... (no tile counter)."""
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    per_group = GROUP_M * tiles_n
    for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, PROGRAMS, flatten=True):
        first_m = (tile // per_group) * GROUP_M
        group_rows = min(tiles_m - first_m, GROUP_M)
        off_m = (first_m + (tile % per_group) % group_rows) * BLOCK_M
        off_n = ((tile % per_group) // group_rows) * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(k_tiles):
            a = a_desc.load([off_m, k * BLOCK_K])
            w = w_desc.load([off_n, k * BLOCK_K])
            acc = tl.dot(a, w.T, acc)
        c_desc.store([off_m, off_n], _epilogue(acc, off_m, off_n, N, bias_ptr, gate_ptr, gate_stride, res_desc,
                                               BLOCK_M, BLOCK_N, EPILOGUE, TOKENS_PER_IMAGE))


def make_gemm(kind, a, w, bias, out, config, epilogue, gate=None, residual=None, programs=None):
    """A no-argument launch of one kernel on fixed buffers (descriptors built once, outside the timed call)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    bm, bn, bk, stages, warps = config
    m, k = a.shape
    n = w.shape[0]
    a_desc = TensorDescriptor.from_tensor(a, [bm, bk])
    w_desc = TensorDescriptor.from_tensor(w, [bn, bk])
    c_desc = TensorDescriptor.from_tensor(out, [bm, bn])
    res_desc = TensorDescriptor.from_tensor(residual if residual is not None else out, [bm, bn])
    gate_arg = gate if gate is not None else bias
    gate_stride = gate.stride(0) if gate is not None else 0
    meta = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, EPILOGUE=EPILOGUES[epilogue],
                TOKENS_PER_IMAGE=TOKENS, num_stages=stages, num_warps=warps)
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    if kind == "persistent":
        grid = (min(programs, tiles),)
        kernel, meta = gemm_persistent_kernel, {**meta, "PROGRAMS": grid[0]}
    else:
        grid, kernel = (tiles,), gemm_tile_kernel

    def launch():
        kernel[grid](a_desc, w_desc, c_desc, res_desc, bias, gate_arg, gate_stride, m, n, k, **meta)
        return out

    return launch


def reference_today(epilogue, a, w, bias, residual, gate):
    """What the fast forward runs today for this GEMM (cuBLAS; the gated residual as its own kernel)."""
    import torch
    import torch.nn.functional as F

    if epilogue == "gelu":
        return lambda: torch._addmm_activation(bias, a, w.t(), use_gelu=True)
    if epilogue == "gated":
        g = gate[:, None, :]
        return lambda: torch.addcmul(residual.view(IMAGES, TOKENS, -1), g,
                                     F.linear(a, w, bias).view(IMAGES, TOKENS, -1)).view(residual.shape)
    return lambda: F.linear(a, w, bias)


def run_shape(name, programs, rounds, results):
    import torch

    from pytest_ditgate.bench.runner import measure_pair
    from pytest_ditgate.quality.metrics import rel_l2

    n, k, epilogue = SHAPES[name]
    ops = operands(n, k, seed=len(results))
    want = expected(epilogue, **ops)
    today = reference_today(epilogue, **ops)
    today_error = rel_l2(today(), want)
    for kind in ("tile", "persistent"):
        for config in CONFIGS:
            label = f"{name} {kind} {'x'.join(map(str, config[:3]))} s{config[3]} w{config[4]}"
            entry = {"shape": name, "m": want.shape[0], "n": n, "k": k, "epilogue": epilogue, "kind": kind,
                     "config": list(config), "today_rel_l2": today_error}
            results.append(entry)
            with one_case(entry, "gemm", label):  # one configuration failing must not lose the others
                out = torch.empty_like(want, dtype=torch.bfloat16)
                launch = make_gemm(kind, ops["a"], ops["w"], ops["bias"], out, config, epilogue, ops["gate"],
                                   ops["residual"], programs)
                start = time.perf_counter()
                launch()
                torch.cuda.synchronize()
                entry["first_call_s"] = round(time.perf_counter() - start, 2)
                entry["rel_l2"] = rel_l2(out, want)
                check_result(entry["rel_l2"], max(4 * today_error, 1e-2), f"float32 (cuBLAS today {today_error:.3e})")
                pair = measure_pair(launch, today, mechanism="graph", warmup=10, rounds=rounds,
                                    labels=("triton", "today"))
                entry.update(triton_ms=pair.a.median_ms, today_ms=pair.b.median_ms, ratio=pair.ratio,
                             ratio_interval=[pair.ci_low, pair.ci_high], triton_tflops=tflops(n, k, pair.a.median_ms),
                             today_tflops=tflops(n, k, pair.b.median_ms))
                log(f"[gemm] {label}: {pair.describe()}")


def table(results, peak: float | None) -> list[str]:
    """One row per kernel and tile; ``of peak`` against the device profile's measured bf16 GEMM peak."""
    lines = [f"{'gemm':<9} {'epilogue':<8} {'kernel':<10} {'tile':<12} {'triton ms':>9} {'today ms':>9} "
             f"{'ratio':>7} {'TFLOP/s':>8} {'of peak':>7} {'rel-L2':>9}"]
    for e in results:
        tile = f"{e['config'][0]}x{e['config'][1]}x{e['config'][2]}"
        head = f"{e['shape']:<9} {e['epilogue']:<8} {e['kind']:<10} {tile:<12}"
        if "triton_ms" not in e:
            lines.append(f"{head} {e.get('error', 'not run')[:70]}")
            continue
        lines.append(f"{head} {e['triton_ms']:>9.4f} {e['today_ms']:>9.4f} {e['ratio']:>7.3f} "
                     f"{e['triton_tflops']:>8.0f} {of_peak(e['triton_tflops'], peak):>7} {e['rel_l2']:>9.2e}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--rounds", type=int, default=100)
    args = parser.parse_args()

    import torch

    programs = torch.cuda.get_device_properties(0).multi_processor_count
    peak, peak_source = gemm_peak_tflops()
    results: list[dict] = []
    for name in args.shapes.split(","):
        run_shape(name, programs, args.rounds, results)
        write_record(args.out, results, triton=triton.__version__, programs=programs, gemm_peak_tflops=peak,
                     gemm_peak_source=peak_source,
                     timer="pytest_ditgate measure_pair, mechanism graph, interleaved rounds",
                     today="cuBLAS (F.linear; _addmm_activation with the GELU epilogue for fc1); for the gated "
                           "GEMMs cuBLAS plus torch.addcmul, the lone gated-residual kernel")
    print("\n".join(table(results, peak)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
