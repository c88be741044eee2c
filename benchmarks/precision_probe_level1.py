"""The precision probe on a stand-in for a public level-1 kernel benchmark: which downgrades ``check_kernel``
catches, and whether it ever rejects an honest kernel (issue 48).

78 small problems built from torch ops in the shape of KernelBench's level 1 (not the benchmark itself, which
stays held out): 18 GEMMs (square, rectangular, batched, matrix-vector, large and small K, irregular,
tall-skinny, 3D and 4D tensor-matrix, diagonal, symmetric, triangular, transposed), 14 activations, 8 norms,
6 poolings, 7 reductions (sum, mean, max, min, product, argmax, argmin), 12 convolutions (1D/2D/3D, transposed,
depthwise, separable, pointwise, dilated, strided), a GELU and 5 scans, and 7 losses (each a scalar mean, as
there). Inputs are float32 (labels, masks and margins where the problem has them).

Candidates, each checked with ``check_kernel``'s defaults (5 trials, 3 extremal trials):

- downgrades: the problem with every floating input rounded to bf16 (``bf16 inputs``) or fp16
  (``fp16 inputs``) before the float32 op, and TF32 math (operands rounded to 10 mantissa bits); *caught*
  means the check fails (``precision_downgrade``, or ``mismatch`` where the error bound sees it first);
- honest: the float32 op itself, float64-then-cast, and the op on non-contiguous copies of its inputs
  (``--compile`` adds ``torch.compile``); an *honest rejection* is any failure.

Targets: bf16 inputs caught on at least 70 problems; fp16 inputs and TF32 math caught on every GEMM,
convolution and reduction (argmax and argmin return indices: out of the probe's scope); no honest rejection.
The ``blind_spots`` part measures what the probe cannot see (docs/kernel_check.md): argmin, the
cosine-similarity loss, KL divergence in bf16, a partial downgrade (bf16 weights with fp32 activations),
per-tensor-scaled fp8, stochastic rounding, and a bf16 GEMM that adds 4, 16 or 64 partial sums in bf16.
Timer: ``time.perf_counter`` around each check.

    python benchmarks/precision_probe_level1.py --out benchmarks/results

writes ``precision_probe_level1_<arch>.json`` (with provenance) and exits 1 when a target is missed.
``--problems "square matmul,relu"`` runs a subset.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import harness

TIMER = "time.perf_counter around each whole check_kernel call"
BF16_TARGET = 70
#: categories on which fp16 inputs and TF32 math must be caught on every problem
EVERY = ("gemm", "conv", "reduction")


@dataclass(frozen=True)
class Problem:
    """One problem: its name, category, the float32 reference and how its inputs are drawn."""

    name: str
    category: str
    fn: Callable[..., Any]
    inputs: tuple[tuple[Any, ...], ...]  # ("normal" | "positive" | "near_one" | "prob" | "sym" | "triu" | "tril"
    #                                      | "sign" | "label" | "mask", shape[, extra])
    dtype: str = "float32"  # the floating inputs' dtype


def draw(spec: tuple[Any, ...], seed: int) -> Any:
    import torch

    from pytest_ditgate.correctness.inputs import make_tensor

    kind, shape = spec[0], spec[1]
    if kind == "label":
        return make_tensor(shape, "int64", seed=seed, low=0, high=spec[2])
    if kind == "mask":
        return make_tensor(shape, "float32", seed=seed) > 0
    x = make_tensor(shape, "float32", seed=seed)
    if kind == "positive":
        return x.abs() + 0.1
    if kind == "near_one":
        return 1 + x / 100
    if kind == "prob":
        return torch.softmax(x, -1)
    if kind == "sym":
        return (x + x.transpose(-1, -2)) / 2
    if kind == "triu":
        return torch.triu(x)
    if kind == "tril":
        return torch.tril(x)
    if kind == "sign":
        return torch.where(x > 0, 1.0, -1.0)
    return x


def problems() -> list[Problem]:
    import torch
    import torch.nn.functional as F

    n = lambda *shape: ("normal", shape)  # noqa: E731
    gemm = [
        ("square matmul", lambda a, b: a @ b, (n(256, 256), n(256, 256))),
        ("rectangular matmul", lambda a, b: a @ b, (n(128, 256), n(256, 64))),
        ("batched matmul", torch.bmm, (n(8, 64, 128), n(8, 128, 32))),
        ("matrix-vector", lambda a, b: a @ b, (n(256, 1024), n(1024, 1))),
        ("large K matmul", lambda a, b: a @ b, (n(32, 8192), n(8192, 32))),
        ("small K matmul", lambda a, b: a @ b, (n(256, 16), n(16, 256))),
        ("irregular matmul", lambda a, b: a @ b, (n(123, 457), n(457, 77))),
        ("tall-skinny matmul", lambda a, b: a @ b, (n(512, 32), n(32, 512))),
        ("3D tensor-matrix", lambda a, b: a @ b, (n(4, 64, 128), n(128, 32))),
        ("4D tensor-matrix", lambda a, b: torch.einsum("bijl,lk->bijk", a, b), (n(2, 8, 16, 64), n(64, 32))),
        ("diagonal matmul", lambda d, b: torch.diag(d) @ b, (n(256), n(256, 128))),
        ("symmetric matmul", lambda a, b: a @ b, (("sym", (256, 256)), ("sym", (256, 256)))),
        ("upper triangular matmul", lambda a, b: torch.triu(a @ b), (("triu", (256, 256)), ("triu", (256, 256)))),
        ("lower triangular matmul", lambda a, b: torch.tril(a @ b), (("tril", (256, 256)), ("tril", (256, 256)))),
        ("transposed A", lambda a, b: a.T @ b, (n(256, 128), n(256, 64))),
        ("transposed B", lambda a, b: a @ b.T, (n(128, 256), n(64, 256))),
        ("transposed both", lambda a, b: a.T @ b.T, (n(256, 128), n(64, 256))),
        ("linear layer", F.linear, (n(64, 512), n(256, 512), n(256))),
    ]
    x = (n(16, 1024),)
    activation = [
        ("relu", torch.relu, x), ("leaky relu", lambda t: F.leaky_relu(t, 0.01), x), ("sigmoid", torch.sigmoid, x),
        ("tanh", torch.tanh, x), ("softmax", lambda t: torch.softmax(t, 1), x),
        ("log-softmax", lambda t: torch.log_softmax(t, 1), x), ("swish", lambda t: t * torch.sigmoid(t), x),
        ("gelu", F.gelu, x), ("selu", torch.selu, x), ("hardsigmoid", F.hardsigmoid, x), ("softplus", F.softplus, x),
        ("softsign", F.softsign, x), ("elu", F.elu, x), ("hardtanh", lambda t: F.hardtanh(t, -1.0, 1.0), x),
    ]
    img = n(16, 32, 8, 8)
    norm = [
        ("batch norm", lambda t, w, b: F.batch_norm(t, None, None, w, b, training=True), (img, n(32), n(32))),
        ("instance norm", F.instance_norm, (img,)),
        ("group norm", lambda t, w, b: F.group_norm(t, 8, w, b), (img, n(32), n(32))),
        ("rms norm", lambda t: t / torch.sqrt(t.pow(2).mean(1, keepdim=True) + 1e-5), (img,)),
        ("frobenius norm", lambda t: t / torch.linalg.vector_norm(t), (img,)),
        ("l1 norm", lambda t: t / t.abs().sum(1, keepdim=True), (n(16, 1024),)),
        ("l2 norm", lambda t: t / torch.linalg.vector_norm(t, dim=1, keepdim=True), (n(16, 1024),)),
        ("layer norm", lambda t: F.layer_norm(t, t.shape[1:]), (img,)),
    ]
    pool = [
        ("max pool 1d", lambda t: F.max_pool1d(t, 4, 2), (n(16, 32, 128),)),
        ("max pool 2d", lambda t: F.max_pool2d(t, 2), (n(8, 16, 32, 32),)),
        ("max pool 3d", lambda t: F.max_pool3d(t, 2), (n(2, 8, 16, 16, 16),)),
        ("avg pool 1d", lambda t: F.avg_pool1d(t, 4, 2), (n(16, 32, 128),)),
        ("avg pool 2d", lambda t: F.avg_pool2d(t, 2), (n(8, 16, 32, 32),)),
        ("avg pool 3d", lambda t: F.avg_pool3d(t, 2), (n(2, 8, 16, 16, 16),)),
    ]
    r = (n(16, 256, 64),)
    reduction = [
        ("sum reduction", lambda t: t.sum(1), r), ("mean reduction", lambda t: t.mean(1), r),
        ("max reduction", lambda t: t.amax(1), r), ("min reduction", lambda t: t.amin(1), r),
        ("product reduction", lambda t: t.prod(1), (("near_one", (16, 64, 64)),)),
        ("argmax", lambda t: t.argmax(1), r), ("argmin", lambda t: t.argmin(1), r),
    ]
    conv = [
        ("conv1d", F.conv1d, (n(16, 32, 128), n(64, 32, 3))),
        ("conv2d square", F.conv2d, (n(8, 16, 32, 32), n(32, 16, 3, 3))),
        ("conv2d asymmetric kernel", F.conv2d, (n(8, 16, 32, 32), n(32, 16, 3, 5))),
        ("conv3d", F.conv3d, (n(2, 8, 8, 16, 16), n(16, 8, 3, 3, 3))),
        ("transposed conv1d", F.conv_transpose1d, (n(16, 32, 64), n(32, 16, 3))),
        ("transposed conv2d", F.conv_transpose2d, (n(8, 16, 16, 16), n(16, 32, 3, 3))),
        ("transposed conv3d", F.conv_transpose3d, (n(2, 8, 8, 8, 8), n(8, 16, 3, 3, 3))),
        ("depthwise conv2d", lambda t, w: F.conv2d(t, w, groups=16), (n(8, 16, 32, 32), n(16, 1, 3, 3))),
        ("depthwise-separable conv2d", lambda t, dw, pw: F.conv2d(F.conv2d(t, dw, groups=16), pw),
         (n(8, 16, 32, 32), n(16, 1, 3, 3), n(32, 16, 1, 1))),
        ("pointwise conv2d", F.conv2d, (n(8, 64, 16, 16), n(32, 64, 1, 1))),
        ("dilated conv2d", lambda t, w: F.conv2d(t, w, dilation=2), (n(8, 16, 32, 32), n(32, 16, 3, 3))),
        ("strided conv2d with bias", lambda t, w, b: F.conv2d(t, w, b, stride=2),
         (n(8, 16, 32, 32), n(32, 16, 3, 3), n(32))),
    ]
    s = (n(16, 1024),)
    scan = [
        ("new gelu", lambda t: 0.5 * t * (1 + torch.tanh(0.7978845608028654 * (t + 0.044715 * t.pow(3)))), s),
        ("cumsum", lambda t: torch.cumsum(t, 1), s),
        ("cumprod", lambda t: torch.cumprod(t, 1), (("near_one", (16, 1024)),)),
        ("reverse cumsum", lambda t: torch.cumsum(t.flip(1), 1).flip(1), s),
        ("exclusive cumsum", lambda t: torch.cumsum(t, 1) - t, s),
        ("masked cumsum", lambda t, m: torch.cumsum(t * m, 1), (n(16, 1024), ("mask", (16, 1024)))),
    ]
    loss = [
        ("mse loss", F.mse_loss, (n(128, 64), n(128, 64))),
        ("cross-entropy loss", F.cross_entropy, (n(128, 10), ("label", (128,), 10))),
        ("huber loss", F.smooth_l1_loss, (n(128, 64), n(128, 64))),
        ("cosine-similarity loss", lambda p, t: torch.mean(1 - F.cosine_similarity(p, t, dim=1)),
         (n(128, 256), n(128, 256))),
        ("kl-divergence loss", lambda p, t: F.kl_div(torch.log(p), t, reduction="batchmean"),
         (("prob", (128, 64)), ("prob", (128, 64)))),
        ("triplet-margin loss", F.triplet_margin_loss, (n(128, 64), n(128, 64), n(128, 64))),
        ("hinge loss", lambda p, t: torch.mean(torch.clamp(1 - p * t, min=0)), (n(128, 1), ("sign", (128, 1)))),
    ]
    found = []
    for category, entries in (("gemm", gemm), ("activation", activation), ("norm", norm), ("pool", pool),
                              ("reduction", reduction), ("conv", conv), ("scan", scan), ("loss", loss)):
        found += [Problem(name, category, fn, specs) for name, fn, specs in entries]
    return found


def make_inputs(problem: Problem) -> Callable[[int], tuple]:
    import torch

    def inputs(seed: int) -> tuple:
        drawn = (draw(spec, seed * 101 + i) for i, spec in enumerate(problem.inputs))
        return tuple(t.to(getattr(torch, problem.dtype)) if t.is_floating_point() else t for t in drawn)
    return inputs


# -- candidates --------------------------------------------------------------------------------------

def _rounded(fn: Callable[..., Any], to: Callable[[Any], Any]) -> Callable[..., Any]:
    return lambda *args: fn(*(to(a) if a.is_floating_point() else a for a in args))


def tf32(t: Any) -> Any:
    """``t`` with 10 explicit mantissa bits, as TF32 tensor cores read fp32 operands."""
    import torch

    bits = t.float().contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32).reshape(t.shape)


def downgrades(fn: Callable[..., Any]) -> dict[str, Callable[..., Any]]:
    import torch

    return {"bf16 inputs": _rounded(fn, lambda a: a.to(torch.bfloat16).float()),
            "fp16 inputs": _rounded(fn, lambda a: a.to(torch.float16).float()),
            "tf32 math": _rounded(fn, tf32)}


def honest(fn: Callable[..., Any], compile_too: bool) -> dict[str, Callable[..., Any]]:
    import torch

    def float64_then_cast(*args):
        out = fn(*(a.double() if a.is_floating_point() else a for a in args))
        return out.float() if out.is_floating_point() else out

    def noncontiguous(*args):
        copies = []
        for a in args:
            if a.dim() == 0:
                copies.append(a)
                continue
            wide = torch.zeros(a.shape[:-1] + (2 * a.shape[-1],), dtype=a.dtype, device=a.device)
            wide[..., ::2] = a
            copies.append(wide[..., ::2])
        return fn(*copies)

    found = {"float32 op": fn, "float64-then-cast": float64_then_cast, "non-contiguous": noncontiguous}
    if compile_too:
        found["torch.compile"] = torch.compile(fn, dynamic=False)
    return found


def check(candidate: Callable[..., Any], problem: Problem, label: str, **options: Any) -> dict[str, Any]:
    from pytest_ditgate import GateFailure, check_kernel

    start = time.perf_counter()
    try:
        report = check_kernel(candidate, problem.fn, make_inputs(problem), label=label, **options)
        verdict = "passed"
    except GateFailure as failure:
        report, verdict = failure.report, failure.reason
    seconds = time.perf_counter() - start
    precision = report.precision if report is not None else None
    return {"verdict": verdict, "probe": precision.status if precision else None,
            "probe_outputs": [o.line() for o in precision.outputs] if precision else [],
            "probe_notes": list(precision.notes) if precision else [], "seconds": round(seconds, 3)}


# -- the blind spots -----------------------------------------------------------------------------------

def blind_spots() -> list[tuple[str, Problem, Callable[..., Any], str]]:
    """``(name, problem, candidate, what it shows)``: the cases docs/kernel_check.md cites."""
    import torch
    import torch.nn.functional as F

    by_name = {p.name: p for p in problems()}
    bf16 = lambda a: a.to(torch.bfloat16).float()  # noqa: E731

    def fp8_scaled(a):
        scale = a.abs().amax() / 448
        return (a / scale).to(torch.float8_e4m3fn).float() * scale

    def stochastic_bf16(a):
        generator = torch.Generator(a.device).manual_seed(1234)  # the same draws every call: deterministic
        bits = a.contiguous().view(torch.int32)
        noise = torch.randint(0, 1 << 16, a.shape, generator=generator, dtype=torch.int32, device=a.device)
        return ((bits + noise) & ~0xFFFF).view(torch.float32)

    def bf16_partials(splits):
        """A bf16 GEMM whose float32 partial products over ``splits`` slices of K are rounded to bf16 and added in
        bf16: a split-K kernel that reduces in bf16 (what cuBLAS's reduced-precision switch allows)."""
        def kernel(a, b):
            total = None
            for part_a, part_b in zip(a.chunk(splits, -1), b.chunk(splits, 0)):
                part = (part_a.float() @ part_b.float()).to(torch.bfloat16)
                total = part if total is None else total + part
            return total
        return kernel

    bf16_gemm = Problem("bf16 matmul, K=4096", "gemm", lambda a, b: a @ b,
                        (("normal", (256, 4096)), ("normal", (4096, 256))), dtype="bfloat16")
    linear = by_name["linear layer"]
    # a weighted sum of positive terms: its rounding errors average away, so the bound alone cannot see them
    weighted = Problem("weighted row sums of positives", "reduction", lambda x, w: (x * w).sum(-1),
                       (("positive", (16, 32768)), ("positive", (32768,))))
    return [
        ("argmin, bf16 inputs", by_name["argmin"], _rounded(by_name["argmin"].fn, bf16),
         "an index output: out of the probe's scope"),
        ("cosine-similarity loss, bf16 inputs", by_name["cosine-similarity loss"],
         _rounded(by_name["cosine-similarity loss"].fn, bf16), "a scalar: one element cannot reach 1e-4"),
        ("kl-divergence loss, bf16 inputs", by_name["kl-divergence loss"],
         _rounded(by_name["kl-divergence loss"].fn, bf16), "a scalar"),
        ("linear layer, bf16 weights with fp32 activations", linear,
         lambda x, w, b: F.linear(x, bf16(w), b), "a partial downgrade: the output still moves with x and b"),
        ("square matmul, per-tensor-scaled fp8", by_name["square matmul"],
         _rounded(by_name["square matmul"].fn, fp8_scaled), "the scaled grid does not line up with the cells"),
        ("square matmul, stochastic rounding to bf16", by_name["square matmul"],
         _rounded(by_name["square matmul"].fn, stochastic_bf16), "the rounding moves with the input"),
        ("weighted row sums, bf16 weights with fp32 activations", weighted,
         lambda x, w: weighted.fn(x, bf16(w)), "a partial downgrade the bound cannot see either"),
        ("weighted row sums, per-tensor-scaled fp8", weighted, _rounded(weighted.fn, fp8_scaled),
         "per-tensor fp8 where the bound cannot see it"),
        ("weighted row sums, stochastic rounding to bf16", weighted, _rounded(weighted.fn, stochastic_bf16),
         "stochastic rounding where the bound cannot see it"),
        *((f"bf16 matmul K=4096, {splits} partial sums added in bf16", bf16_gemm, bf16_partials(splits),
           "a hand-written reduction in bf16: no input move shows it, and a few partials stay within bf16's bound")
          for splits in (4, 16, 64)),
    ]


def run_blind_spots() -> list[dict[str, Any]]:
    from pytest_ditgate import GateFailure, check_kernel

    rows = []
    for name, problem, candidate, what in blind_spots():
        start = time.perf_counter()
        try:
            report = check_kernel(candidate, problem.fn, make_inputs(problem), label=name)
            verdict = "passed"
        except GateFailure as failure:
            report, verdict = failure.report, failure.reason
        rows.append({"case": name, "what": what, "verdict": verdict, "probe": report.precision.status,
                     "probe_summary": report.precision.summary(), "seconds": round(time.perf_counter() - start, 3)})
        harness.log(f"[blind spot] {name}: {verdict}, probe {report.precision.status}")
    return rows


# -- the run -------------------------------------------------------------------------------------------

def run(selected: list[str] | None, compile_too: bool) -> list[dict[str, Any]]:
    rows = []
    for problem in problems():
        if selected and problem.name not in selected:
            continue
        row: dict[str, Any] = {"problem": problem.name, "category": problem.category, "downgrades": {}, "honest": {}}
        for name, candidate in downgrades(problem.fn).items():
            row["downgrades"][name] = check(candidate, problem, f"{problem.name}: {name}")
        for name, candidate in honest(problem.fn, compile_too).items():
            row["honest"][name] = check(candidate, problem, f"{problem.name}: {name}")
        rows.append(row)
        harness.log(f"{problem.name}: " + ", ".join(f"{k} {v['verdict']}" for k, v in row["downgrades"].items())
                    + "; honest " + ", ".join(f"{k} {v['verdict']}" for k, v in row["honest"].items()))
    return rows


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {"problems": len(rows), "downgrades": {}, "honest": {}}
    for name in ("bf16 inputs", "fp16 inputs", "tf32 math"):
        results = [(row, row["downgrades"][name]) for row in rows]
        caught = [row["problem"] for row, r in results if r["verdict"] != "passed"]
        missed_every = [row["problem"] for row, r in results
                        if row["category"] in EVERY and r["verdict"] == "passed" and row["problem"] not in
                        ("argmax", "argmin")]
        summary["downgrades"][name] = {
            "caught": len(caught),
            "as_precision_downgrade": sum(r["verdict"] == "precision_downgrade" for _, r in results),
            "as_mismatch": sum(r["verdict"] == "mismatch" for _, r in results),
            "missed": [row["problem"] for row, r in results if r["verdict"] == "passed"],
            "missed_gemm_conv_reduction": missed_every}
    honest_names = sorted({name for row in rows for name in row["honest"]})
    for name in honest_names:
        rejected = [f"{row['problem']} ({row['honest'][name]['verdict']})" for row in rows
                    if row["honest"][name]["verdict"] != "passed"]
        summary["honest"][name] = {"runs": len(rows), "rejected": rejected}
    return summary


def targets(summary: dict[str, Any]) -> list[str]:
    missed = []
    if summary["downgrades"]["bf16 inputs"]["caught"] < min(BF16_TARGET, summary["problems"] - 4):
        missed.append("bf16 inputs caught")
    for name in ("fp16 inputs", "tf32 math"):
        if summary["downgrades"][name]["missed_gemm_conv_reduction"]:
            missed.append(f"{name} on every GEMM, convolution and reduction")
    if any(h["rejected"] for h in summary["honest"].values()):
        missed.append("no honest rejection")
    return missed


def table(summary: dict[str, Any]) -> str:
    lines = [f"| downgrade | caught of {summary['problems']} | as precision_downgrade | as mismatch | missed |",
             "|---|---|---|---|---|"]
    for name, d in summary["downgrades"].items():
        lines.append(f"| {name} | {d['caught']} | {d['as_precision_downgrade']} | {d['as_mismatch']} | "
                     f"{', '.join(d['missed']) or '-'} |")
    lines += ["", "| honest candidate | runs | rejected |", "|---|---|---|"]
    for name, h in summary["honest"].items():
        rejected = f"{len(h['rejected'])}" + (": " + ", ".join(h["rejected"]) if h["rejected"] else "")
        lines.append(f"| {name} | {h['runs']} | {rejected} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="folder for precision_probe_level1_<arch>.json")
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    parser.add_argument("--problems", default="", help="comma-separated problem names (default: all 78)")
    parser.add_argument("--compile", action="store_true", help="add torch.compile as an honest candidate")
    parser.add_argument("--no-blind-spots", action="store_true")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    selected = [name.strip() for name in args.problems.split(",") if name.strip()] or None
    start = time.perf_counter()
    rows = run(selected, args.compile)
    spots = [] if args.no_blind_spots else run_blind_spots()
    summary = summarise(rows)
    missed = targets(summary) if not selected else []
    record = {"benchmark": "precision_probe_level1", "command": " ".join(["python", *sys.argv]),
              "threads": torch.get_num_threads(), "timer": TIMER, "seconds": round(time.perf_counter() - start, 1),
              "targets": {"bf16_inputs_caught_at_least": BF16_TARGET, "fp16_and_tf32_on_every": list(EVERY),
                          "honest_rejections": 0},
              "summary": summary, "missed": missed, "blind_spots": spots, "problems": rows,
              "environment": harness.environment()}
    harness.write_record(args.out, "precision_probe_level1", record)
    print(table(summary))
    for spot in spots:
        print(f"blind spot: {spot['case']}: {spot['verdict']} (probe {spot['probe']})")
    if missed:
        print(f"target missed: {', '.join(missed)}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
