"""Benchmark: what the judge's dispatch observer adds to each op a candidate's test runs eagerly.

The agent loop's judged child runs its tests under :func:`pytest_ditgate.experiment.observe.make_observer`,
a Python ``TorchDispatchMode``. Any such mode costs a Python call per op; the observer's own work on top of
that (dtype checks, GEMM weight sampling) is what this project controls. One eager workload of small ops
(LayerNorm, a linear layer, GELU, a residual: the ops of an eager sampling loop) is timed three ways,
interleaved round by round: plain, under an empty dispatch mode, and under the observer.

    python benchmarks/observer_overhead.py [--device cuda] [--out results.json]

Prints a table last: median ms per workload, the per-op cost of the empty mode and of the observer above
plain, and the observer's own share (observer minus empty mode).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import environment, log  # noqa: E402


def workload(device: str, width: int, layers: int) -> Callable[[], Any]:
    """``layers`` rounds of LayerNorm, linear, scale-and-add and GELU on a (4, 64, width) activation."""
    import torch

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4, 64, width, generator=generator).to(device)
    linear = torch.nn.Linear(width, width).to(device)

    @torch.no_grad()
    def run() -> Any:
        y = x
        for _ in range(layers):
            y = torch.nn.functional.layer_norm(y, (width,))
            y = linear(y) * 0.5 + y
            y = torch.nn.functional.gelu(y)
        if y.is_cuda:
            torch.cuda.synchronize()
        return y

    return run


def empty_mode() -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Empty(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return func(*args, **(kwargs or {}))

    return Empty()


def timed(run: Callable[[], Any], mode: Any) -> float:
    started = time.perf_counter()
    if mode is None:
        run()
    else:
        with mode:
            run()
    return (time.perf_counter() - started) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from harness import Evidence, make_observer

    run = workload(args.device, args.width, args.layers)
    evidence = Evidence()
    modes = {"plain": None, "empty mode": empty_mode(), "observer": make_observer(evidence)}
    for mode in modes.values():  # warm-up: allocator, kernels, the observer's per-overload cache
        timed(run, mode)
    ops_per_run = evidence.ops
    times: dict[str, list[float]] = {name: [] for name in modes}
    for _ in range(args.rounds):
        for name, mode in modes.items():
            times[name].append(timed(run, mode))
    median = {name: statistics.median(values) for name, values in times.items()}
    per_op_us = {name: (median[name] - median["plain"]) * 1e3 / ops_per_run for name in ("empty mode", "observer")}
    record = {"benchmark": "observer_overhead", "environment": environment(), "device": args.device,
              "workload": {"width": args.width, "layers": args.layers, "ops_per_run": ops_per_run},
              "rounds": args.rounds, "times_ms": times, "median_ms": median,
              "per_op_us_above_plain": per_op_us,
              "observer_own_us_per_op": per_op_us["observer"] - per_op_us["empty mode"],
              "observer_over_plain": median["observer"] / median["plain"],
              "evidence": evidence.items}
    if args.out:
        args.out.write_text(json.dumps(record, indent=1) + "\n")
        log(f"wrote {args.out}")
    print(f"{'':12} {'median ms':>10} {'us/op above plain':>18}")
    for name in modes:
        extra = f"{per_op_us[name]:18.2f}" if name in per_op_us else f"{'':>18}"
        print(f"{name:12} {median[name]:10.2f} {extra}")
    print(f"{ops_per_run} ops a run; the observer's own work: {record['observer_own_us_per_op']:.2f} us/op; "
          f"observer / plain {record['observer_over_plain']:.2f}x")


if __name__ == "__main__":
    main()
