"""Benchmark: how close each timing mechanism comes to the true kernel time, and how well
``measure_pair`` detects a small slowdown.

Over the five cases of the design brief's reference table (add 1M bf16, LayerNorm 16x256x1152, matmul
4096^3 bf16, SDPA 16x16x256x72, copy 256 MB fp32) it measures, side by side in one run:

- truth: CUPTI kernel time, computed here independently of the plugin (torch.profiler over back-to-back
  calls, sum of device activity durations / calls, as in the reference anchor script);
- ``measure`` with mechanism auto, graph, events and wall, and cupti in the sustained regime;
- triton's ``do_bench`` and ``do_bench_cudagraph`` (when triton is installed).

Targets (issue 4): auto and graph within 5 % of truth on the four non-matmul cases, graph at least as close
as do_bench_cudagraph (median error over CLOSENESS_ROUNDS side-by-side rounds), CV below 2 %; matmul: both regimes reported. Detection power: an injected 3 %
slowdown (the same add on 3 % more elements) flagged in >= 19 of 20 repeats of ``measure_pair``, a null
change (A vs A) flagged in <= 1 of 20, "flagged" meaning the 95 % CI bound shows a difference of at least
1 % (MARGIN; the count for "CI excludes 1" is printed beside it). Ledger write below 1 ms per measurement (runs on CPU too).

Usage: ``python benchmarks/timer_fidelity.py --out benchmarks/results`` (writes timer_fidelity_<arch>.json,
prints a table last, exits 1 when a target is missed). Every case is guarded: one failure is recorded and the
others still run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from harness import ROOT, guarded, log  # noqa: E402 - puts the repository on sys.path

TOLERANCE = 0.05  # within 5 % of truth
CV_LIMIT = 0.02
DBCG_MARGIN = 0.005  # "at least as close as do_bench_cudagraph", within half a percentage point of noise
#: rounds of (truth, graph, do_bench_cudagraph) side by side for "as close as": the launch latency between
#: graph nodes toggles between two levels a few times a second, so one reading of do_bench_cudagraph (which
#: keeps it) is a coin toss between two errors; the median error over the rounds is compared
CLOSENESS_ROUNDS = 5
REPEATS = 20
#: a change counts as flagged when the CI bound shows it slower (or faster) by at least this fraction,
#: the question ditbench.pair asks with min_speedup; the stricter "CI excludes 1" is reported beside it
MARGIN = 0.01


def cupti_truth(fn: Callable[[], Any], iters: int = 50) -> float:
    """Mean device time per call (ms): sum of device activity durations over back-to-back calls."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA
    total_ns = sum(e.duration_ns() for e in prof.profiler.kineto_results.events()
                   if e.device_type() == cuda and not e.is_user_annotation())
    return total_ns / iters / 1e6


def measurement_row(m: Any) -> dict:
    return {"median_ms": m.median_ms, "cv": m.cv, "n": m.n, "mechanism": m.mechanism, "regime": m.regime,
            "calls_per_sample": m.calls_per_sample, "clocks_start": m.clocks_start, "clocks_end": m.clocks_end,
            "extra": m.extra, "notes": m.mechanism_notes, "samples_ms": list(m.samples_ms)}


def make_cases() -> dict[str, dict]:
    import torch
    import torch.nn.functional as F

    dev, bf = "cuda", torch.bfloat16
    x1 = torch.randn(1 << 20, device=dev, dtype=bf)
    y1 = torch.randn_like(x1)
    x2 = torch.randn(16, 256, 1152, device=dev, dtype=bf)
    a3 = torch.randn(4096, 4096, device=dev, dtype=bf)
    b3 = torch.randn_like(a3)
    q = torch.randn(16, 16, 256, 72, device=dev, dtype=bf)
    k = torch.randn_like(q)
    v = torch.randn_like(q)
    a5 = torch.randn(64 << 20, device=dev, dtype=torch.float32)
    return {
        "add_1M_bf16": dict(fn=torch.add, args=(x1, y1), dtype="bfloat16", shapes=[[1 << 20], [1 << 20]]),
        "layernorm_16x256x1152": dict(fn=lambda x: F.layer_norm(x, (1152,), eps=1e-6), args=(x2,),
                                      dtype="bfloat16", shapes=[[16, 256, 1152]]),
        "matmul_4096_bf16": dict(fn=torch.matmul, args=(a3, b3), dtype="bfloat16", shapes=[[4096, 4096]] * 2),
        "sdpa_16x16x256x72": dict(fn=F.scaled_dot_product_attention, args=(q, k, v), dtype="bfloat16",
                                  shapes=[[16, 16, 256, 72]] * 3),
        "copy_256MB": dict(fn=torch.clone, args=(a5,), dtype="float32", shapes=[[64 << 20]]),
    }


def fidelity(results: dict) -> None:
    import torch

    from pytest_ditgate.bench import measure

    try:
        import triton.testing as tt
    except ImportError:
        tt = None
    cases = make_cases()
    table = results.setdefault("fidelity", {})
    for name, case in cases.items():
        fn, args = case["fn"], case["args"]
        bound = lambda fn=fn, args=args: fn(*args)  # noqa: E731
        row: dict[str, Any] = {"dtype": case["dtype"], "shapes": case["shapes"]}
        table[name] = row
        log(f"== {name}")
        guarded(row, "truth_cupti_ms", lambda: cupti_truth(bound))
        for label, mechanism, regime, idle in (("auto", "auto", None, "subtract"), ("graph", "graph", None, "subtract"),
                                               ("graph_keep", "graph", None, "keep"), ("events", "events", None, "subtract"),
                                               ("wall", "wall", None, "subtract"),
                                               ("cupti_sustained", "cupti", "sustained", "subtract")):
            guarded(row, label, lambda: measurement_row(measure(fn, *args, mechanism=mechanism, regime=regime,
                                                                graph_idle=idle, label=name, dtype=case["dtype"],
                                                                shapes=case["shapes"])))
        if tt is not None:
            guarded(row, "do_bench_ms", lambda: float(tt.do_bench(bound, return_mode="median")))
            guarded(row, "do_bench_cudagraph_ms", lambda: float(tt.do_bench_cudagraph(bound, return_mode="median")))
        if tt is not None and not name.startswith("matmul"):
            guarded(row, "closeness", lambda: closeness(fn, args, bound, tt))
        if name == "add_1M_bf16":
            guarded(row, "graph_cold", lambda: measurement_row(measure(fn, *args, mechanism="graph", l2="cold")))
            guarded(row, "cupti_cold", lambda: measurement_row(measure(fn, *args, mechanism="cupti", l2="cold")))
        torch.cuda.synchronize()
        log(json.dumps({k: (v.get("median_ms") if isinstance(v, dict) else v) for k, v in row.items()
                        if k not in ("dtype", "shapes")}))


def closeness(fn: Callable[..., Any], args: tuple, bound: Callable[[], Any], tt: Any) -> dict:
    """CLOSENESS_ROUNDS rounds of CUPTI truth, the graph mechanism and do_bench_cudagraph, side by side;
    the median relative error of each over the rounds."""
    from pytest_ditgate.bench import measure

    rounds = []
    for _ in range(CLOSENESS_ROUNDS):
        truth = cupti_truth(bound)
        graph = measure(fn, *args, mechanism="graph").median_ms
        dbcg = float(tt.do_bench_cudagraph(bound, return_mode="median"))
        rounds.append({"truth_ms": truth, "graph_ms": graph, "do_bench_cudagraph_ms": dbcg})
    return {"rounds": rounds,
            "graph_error": statistics.median(abs(r["graph_ms"] / r["truth_ms"] - 1) for r in rounds),
            "do_bench_cudagraph_error": statistics.median(abs(r["do_bench_cudagraph_ms"] / r["truth_ms"] - 1)
                                                          for r in rounds)}


def detection(results: dict, mechanisms: tuple[str, ...]) -> None:
    import torch

    from pytest_ditgate.bench import measure_pair

    n = 16 << 20
    big = int(n * 1.03)
    xs = torch.randn(big, device="cuda", dtype=torch.bfloat16)
    ys = torch.randn_like(xs)
    xr, yr = xs[:n], ys[:n]
    reference = lambda: torch.add(xr, yr)  # noqa: E731
    slower = lambda: torch.add(xs, ys)  # noqa: E731  3 % more elements
    out = results.setdefault("detection", {"op": f"add bf16, {n} vs {big} elements (+3 %)", "repeats": REPEATS})
    for mechanism in mechanisms:
        rows = {"slowdown": [], "null": []}
        out[mechanism] = rows
        for _ in range(REPEATS):
            for kind, candidate in (("slowdown", slower), ("null", reference)):
                try:
                    c = measure_pair(candidate, reference, mechanism=mechanism)
                    rows[kind].append({"ratio": c.ratio, "ci_low": c.ci_low, "ci_high": c.ci_high, "n": c.a.n,
                                       "method": c.method, "mechanism": c.a.mechanism})
                except Exception as exc:
                    rows[kind].append({"error": f"{type(exc).__name__}: {exc}"})
        ok = lambda r: "error" not in r  # noqa: E731
        # the gate's question: is the candidate slower (faster) by at least MARGIN, on the CI bound?
        rows["slowdown_flagged"] = sum(1 for r in rows["slowdown"] if ok(r) and r["ci_low"] >= 1.0 + MARGIN)
        rows["null_flagged"] = sum(1 for r in rows["null"] if ok(r) and (r["ci_low"] >= 1.0 + MARGIN
                                                                         or r["ci_high"] <= 1.0 - MARGIN))
        # stricter reading, for information: the CI excludes exactly 1
        rows["slowdown_ci_excludes_1"] = sum(1 for r in rows["slowdown"] if ok(r) and r["ci_low"] > 1.0)
        rows["null_ci_excludes_1"] = sum(1 for r in rows["null"] if ok(r) and (r["ci_low"] > 1.0 or r["ci_high"] < 1.0))
        rows["slowdown_median_ratio"] = statistics.median([r["ratio"] for r in rows["slowdown"] if ok(r)] or [0])
        log(f"detection[{mechanism}]: slowdown flagged {rows['slowdown_flagged']}/{REPEATS}, "
            f"null flagged {rows['null_flagged']}/{REPEATS}")

def ledger_overhead(results: dict) -> None:
    from pytest_ditgate.bench.ledger import Ledger
    from pytest_ditgate.bench.measurement import Measurement

    m = Measurement.from_samples([0.01 + i * 1e-5 for i in range(200)], warmup=10, mechanism="graph",
                                 regime="sustained", l2_mode="warm", label="ledger-probe")
    with tempfile.TemporaryDirectory() as tmp:
        ledger = Ledger(Path(tmp) / "bench.jsonl")
        times = []
        for i in range(200):
            start = time.perf_counter()
            ledger.record_measurement(m, test=f"probe::{i}", lane="bench")
            times.append((time.perf_counter() - start) * 1e3)
        records, bad = ledger.read()
    results["ledger"] = {"writes": len(times), "median_ms": statistics.median(times), "max_ms": max(times),
                         "records_read": len(records), "bad_lines": len(bad), "samples_per_record": 200}

def rel(a: Any, b: Any) -> float | None:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b:
        return abs(a / b - 1.0)
    return None

def med(row: dict, key: str) -> Any:
    value = row.get(key)
    if isinstance(value, dict):
        return value.get("median_ms")
    return value

def verdicts(results: dict) -> list[tuple[str, str, str]]:
    """(target, measured, PASS/FAIL) rows."""
    out = []
    for name, row in results.get("fidelity", {}).items():
        truth = row.get("truth_cupti_ms")
        if name.startswith("matmul"):
            out.append((f"{name}: regimes reported", "spaced(auto) {} / sustained(cupti) {} / graph {}".format(
                *(f"{med(row, k):.4f}" if isinstance(med(row, k), float) else "err"
                  for k in ("auto", "cupti_sustained", "graph"))), "INFO"))
            continue
        for key in ("auto", "graph"):
            err = rel(med(row, key), truth)
            cv = row.get(key, {}).get("cv") if isinstance(row.get(key), dict) else None
            out.append((f"{name}: {key} within 5% of CUPTI", "err" if err is None else f"{err * 100:.2f}%",
                        "PASS" if err is not None and err <= TOLERANCE else "FAIL"))
            out.append((f"{name}: {key} CV < 2%", "err" if cv is None else f"{cv * 100:.2f}%",
                        "PASS" if cv is not None and cv < CV_LIMIT else "FAIL"))
        close = row.get("closeness")
        if isinstance(close, dict) and "graph_error" in close:
            g, d = close["graph_error"], close["do_bench_cudagraph_error"]
            out.append((f"{name}: graph as close as do_bench_cudagraph", f"{g * 100:.2f}% vs {d * 100:.2f}% "
                        f"(median of {len(close['rounds'])} rounds)", "PASS" if g <= d + DBCG_MARGIN else "FAIL"))
    for mechanism, rows in results.get("detection", {}).items():
        if not isinstance(rows, dict) or "slowdown_flagged" not in rows:
            continue
        out.append((f"detect +3% ({mechanism}) >= 19/20", f"{rows['slowdown_flagged']}/{REPEATS}",
                    "PASS" if rows["slowdown_flagged"] >= 19 else "FAIL"))
        out.append((f"null A vs A ({mechanism}) <= 1/20", f"{rows['null_flagged']}/{REPEATS}",
                    "PASS" if rows["null_flagged"] <= 1 else "FAIL"))
        out.append((f"  ({mechanism}) CI excludes 1: +3% / null", f"{rows['slowdown_ci_excludes_1']}/{REPEATS} / "
                    f"{rows['null_ci_excludes_1']}/{REPEATS}", "INFO"))
    ledger = results.get("ledger")
    if isinstance(ledger, dict) and "median_ms" in ledger:
        out.append(("ledger write < 1 ms", f"{ledger['median_ms']:.3f} ms (max {ledger['max_ms']:.3f})",
                    "PASS" if ledger["median_ms"] < 1.0 and not ledger["bad_lines"] else "FAIL"))
    return out

def print_tables(results: dict) -> None:
    cols = ("truth_cupti_ms", "auto", "graph", "graph_keep", "events", "wall", "cupti_sustained", "do_bench_ms",
            "do_bench_cudagraph_ms")
    heads = ("CUPTI", "auto", "graph", "graph-raw", "events", "wall", "cupti-sus", "do_bench", "do_b_cg")
    if results.get("fidelity"):
        print(f"\n=== timer fidelity, median ms per call ({results['provenance']['device'].get('name')}, "
              f"{results['provenance']['device'].get('arch')}) ===")
        print(f"{'case':24s}" + "".join(f"{h:>10s}" for h in heads))
        for name, row in results["fidelity"].items():
            cells = []
            for key in cols:
                value = med(row, key)
                cells.append(f"{value:10.4f}" if isinstance(value, float) else f"{'err':>10s}")
            print(f"{name:24s}" + "".join(cells))
    print("\n=== targets ===")
    for target, measured, verdict in verdicts(results):
        print(f"{verdict:5s} {target:48s} {measured}")

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--skip-detection", action="store_true")
    parser.add_argument("--detection-mechanisms", default="auto,graph")
    ns = parser.parse_args(argv)
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)

    from pytest_ditgate.device import real_device
    from pytest_ditgate.environment import environment_record

    device = real_device()
    results: dict[str, Any] = {
        "benchmark": "timer_fidelity",
        "provenance": environment_record(device, cwd=ROOT),
        "config": {"tolerance": TOLERANCE, "cv_limit": CV_LIMIT, "repeats": REPEATS,
                   "truth": "torch.profiler CUDA activity, sum of device durations over 50 back-to-back calls"},
    }
    results["provenance"]["timers"] = "cupti (torch.profiler/kineto), CUDA graph + events, CUDA events, perf_counter"
    started = time.time()
    if device.is_cuda:
        guarded(results, "fidelity_error", lambda: fidelity(results))
        if not ns.skip_detection:
            mechs = tuple(m for m in ns.detection_mechanisms.split(",") if m)
            guarded(results, "detection_error", lambda: detection(results, mechs))
    else:
        log(f"no CUDA device ({device.describe()}): only the ledger overhead runs")
    guarded(results, "ledger_error", lambda: ledger_overhead(results))
    for key in ("fidelity_error", "detection_error", "ledger_error"):
        if results.get(key) is None:
            results.pop(key, None)
    results["elapsed_s"] = time.time() - started
    results["targets"] = [list(v) for v in verdicts(results)]
    tag = device.arch
    path = out / f"timer_fidelity_{tag}.json"
    path.write_text(json.dumps(results, indent=1, default=str) + "\n")
    log(f"wrote {os.path.relpath(path, ROOT) if path.is_relative_to(ROOT) else path}")
    print_tables(results)
    failed = [target for target, _, verdict in results["targets"] if verdict == "FAIL"]
    if failed:
        log(f"{len(failed)} target(s) missed: {'; '.join(failed)}")
    return 1 if failed else 0

if __name__ == "__main__":
    raise SystemExit(main())
