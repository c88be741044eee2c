"""Why does a CUDA-graph replay read slower than CUPTI's kernel time for microsecond kernels? (issue 4)

For the add 1M bf16 and SDPA cases of timer_fidelity, side by side in one process:
- truth: CUPTI busy time per call over host-launched back-to-back calls;
- five separate graph captures: event-timed ms per call, and from a traced replay the activities per call
  (names), in-graph busy per call and the gaps between nodes (min, median);
- a graph writing into a preallocated output from the normal allocator (``out=``): output placement;
- spacer graphs: [op, sleep] x N minus [sleep] x N (the op spaced as in the truth run).

    python benchmarks/gpu/graph_gap_probe.py > probe.txt

Its committed output predates queued replays: ``CapturedGraph.time_replay`` then launched each timed replay
on an idle device (graph_capture_probe.py compares the two).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import log  # noqa: E402

import torch  # noqa: E402

from pytest_ditgate.bench.graphs import CapturedGraph  # noqa: E402
from pytest_ditgate.bench.timers import Call, busy_ns, profiled  # noqa: E402


def trace(fn, reps):
    """(start ns, end ns, name) of the device activities of ``reps`` calls of ``fn``, in start order."""
    events = profiled(lambda: [fn() for _ in range(reps)])
    return sorted((int(e.start_ns()), int(e.end_ns()), e.name()) for e in events
                  if e.device_type() == torch.autograd.DeviceType.CUDA and not e.is_user_annotation())


def truth(call, n=200):
    for _ in range(20):
        call()
    spans = trace(lambda: [call() for _ in range(n)], 1)
    return busy_ns([(s, e) for s, e, _ in spans]) / n / 1e3, sorted({name[:40] for *_, name in spans})


def capture(body, count):
    """``count`` calls of ``body`` in one graph (the graph mechanism's capture), replayed 20 times to warm up."""
    graph = CapturedGraph([Call(body)], count)
    for _ in range(20):
        graph.graph.replay()
    torch.cuda.synchronize()
    return graph


def replay_us(graph, reps=50):
    """Median event-timed us per call over ``reps`` replays."""
    return statistics.median(graph.time_replay() for _ in range(reps)) * 1e3


def traced_replay(graph):
    spans, count = trace(graph.graph.replay, 1), graph.count
    gaps = [spans[i + 1][0] - spans[i][1] for i in range(len(spans) - 1)]
    return (busy_ns([(s, e) for s, e, _ in spans]) / count / 1e3, len(spans) / count,
            min(gaps) / 1e3 if gaps else 0.0, statistics.median(gaps) / 1e3 if gaps else 0.0)


def main() -> None:
    x = torch.randn(1 << 20, device="cuda", dtype=torch.bfloat16)
    y = torch.randn_like(x)
    out = torch.empty_like(x)
    q, k, v = (torch.randn(16, 16, 256, 72, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    cases = {"add": (lambda: torch.add(x, y), lambda: torch.add(x, y, out=out), 1500),
             "sdpa": (lambda: sdpa(q, k, v), None, 200)}
    print(f"device {torch.cuda.get_device_name()} torch {torch.__version__}")
    for name, (call, call_out, count) in cases.items():
        t, kinds = truth(call)
        print(f"\n== {name}: truth CUPTI busy {t:.3f} us per call; activities {kinds}")
        for i in range(5):
            g = capture(call, count)
            ev = replay_us(g)
            busy, per_call, gmin, gmed = traced_replay(g)
            print(f"  capture {i}: events {ev:.3f} us ({ev / t - 1:+.1%})  traced busy {busy:.3f} ({busy / t - 1:+.1%}) "
                  f"acts/call {per_call:.1f} gap min {gmin:.3f} med {gmed:.3f} us  events-busy {ev - busy:.3f}")
            del g
        if call_out is not None:
            g = capture(call_out, count)
            ev = replay_us(g)
            busy, *_ = traced_replay(g)
            print(f"  out= preallocated: events {ev:.3f} us ({ev / t - 1:+.1%}) traced busy {busy:.3f} ({busy / t - 1:+.1%})")
        cycles = 4000  # about 2 us at 1.98 GHz
        spacer = capture(lambda: torch.cuda._sleep(cycles), count)
        spaced = capture(lambda: (call(), torch.cuda._sleep(cycles)), count)
        s, p = replay_us(spacer), replay_us(spaced)
        print(f"  spaced: [op, sleep] {p:.3f} - [sleep] {s:.3f} = {p - s:.3f} us ({(p - s) / t - 1:+.1%})")
        log(f"{name} done")


if __name__ == "__main__":
    main()
