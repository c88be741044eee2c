"""Why does the graph mechanism read a LayerNorm 2 % below the eager CUPTI truth? (issue 13, item 4)

Side by side per round, for LayerNorm 16x256x1152 bf16 and copy 256 MB fp32:
- eager: CUPTI busy time per call over 50 host-launched calls (timer_fidelity's truth);
- in_graph: CUPTI busy time per call of the kernels inside a queued replay of the mechanism's graph;
- queued / idle: event time per call of that graph replayed behind a lead replay / on an idle device;
- dbcg: triton's do_bench_cudagraph (median);
- measure(graph) and measure(auto).
If in_graph equals queued, the graph mechanism reads what the kernels take inside a graph, and the gap to
the eager truth is a property of the regime, not a timing error.

    python benchmarks/gpu/graph_truth_probe.py > probe.txt
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import log  # noqa: E402,F401

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from pytest_ditgate.bench import measure  # noqa: E402
from pytest_ditgate.bench.graphs import CapturedGraph  # noqa: E402
from pytest_ditgate.bench.timers import Call, busy_ns, device_spans, profiled  # noqa: E402


def eager_truth(fn, n=50) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    spans = device_spans(profiled(lambda: [fn() for _ in range(n)]), torch.autograd.DeviceType.CUDA)
    return busy_ns(spans) / n / 1e6


def idle_replay(graph: CapturedGraph) -> float:
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    graph.graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / graph.count


def main() -> None:
    import triton.testing as tt

    print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(), flush=True)
    x2 = torch.randn(16, 256, 1152, device="cuda", dtype=torch.bfloat16)
    a5 = torch.randn(64 << 20, device="cuda", dtype=torch.float32)
    cases = {"layernorm": (lambda x: F.layer_norm(x, (1152,), eps=1e-6), (x2,)), "copy": (torch.clone, (a5,))}
    for name, (fn, args) in cases.items():
        bound = lambda: fn(*args)  # noqa: E731
        per = eager_truth(bound)
        graph = CapturedGraph([Call(fn, args)], max(10, int(5.0 / per)))
        print(f"== {name}: {graph.count} calls per replay", flush=True)
        cols = ("eager", "in_graph", "queued", "idle", "dbcg", "m_graph", "m_auto")
        print(" ".join(f"{c:>9}" for c in cols), flush=True)
        rows = []
        for _ in range(5):
            row = {"eager": eager_truth(bound)}
            spans = graph.queued_spans()
            row["in_graph"] = busy_ns(spans) / graph.count / 1e6
            row["queued"] = statistics.median(graph.time_replay() for _ in range(20))
            row["idle"] = statistics.median(idle_replay(graph) for _ in range(20))
            row["dbcg"] = float(tt.do_bench_cudagraph(bound, return_mode="median"))
            row["m_graph"] = measure(fn, *args, mechanism="graph").median_ms
            row["m_auto"] = measure(fn, *args, mechanism="auto").median_ms
            rows.append(row)
            print(" ".join(f"{row[c] * 1e3:9.3f}" for c in cols), flush=True)
        med = {c: statistics.median(r[c] for r in rows) for c in cols}
        print("median us " + " ".join(f"{c}={med[c] * 1e3:.3f}" for c in cols), flush=True)
        print("vs eager  " + " ".join(f"{c}={(med[c] / med['eager'] - 1) * 100:+.2f}%" for c in cols), flush=True)


if __name__ == "__main__":
    main()
