"""Is the 0-18 % spread between CUDA-graph captures of a 2 us add a property of a capture or of time? (issue 4)

graph_gap_probe.py saw five captures of the same add replay at +7 % (two) and +18 % (three) over CUPTI.
Side by side in one process, on the add 1M bf16 case of timer_fidelity:
- kept: eight captures in one shared pool (as the graph mechanism makes them), replayed round-robin over
  six rounds: a capture that is slow in every round is slow by itself; a round where all are slow is time;
- private: six captures each in its own pool, deleted before the next (as graph_gap_probe.py did);
- the output addresses each capture wrote (one address for every node, or several);
- truth (CUPTI busy per call, host launched) before and after, and the SM clock of every round (NVML);
- the cost of switching between graphs, and a replay launched on an idle device against one queued behind
  an untimed lead replay (what the graph mechanism times since);
- queued replays in 0.25 s windows after a profiler session.
The sections before "queued" launch every replay on an idle device.

    python benchmarks/gpu/graph_capture_probe.py > probe.txt
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import log  # noqa: E402

import torch  # noqa: E402

from pytest_ditgate.bench.graphs import CapturedGraph, floor_gap_ns  # noqa: E402
from pytest_ditgate.bench.timers import Call, busy_ns, device_spans, profiled  # noqa: E402

COUNT = 2500


def sm_clock() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        return f"{pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)} MHz"
    except Exception as exc:  # noqa: BLE001
        return f"clock n/a ({type(exc).__name__})"


def truth_us(call, n=300) -> float:
    for _ in range(30):
        call()
    torch.cuda.synchronize()
    spans = device_spans(profiled(lambda: [call() for _ in range(n)]), torch.autograd.DeviceType.CUDA)
    return busy_ns(spans) / n / 1e3


def recording(x, y, seen):
    """The add, noting the output address of every captured node."""
    def body():
        out = torch.add(x, y)
        seen.append(out.data_ptr())
        return out
    return body


def capture(x, y, pool):
    seen: list[int] = []
    graph = CapturedGraph([Call(recording(x, y, seen))], COUNT, pool)
    node_ptrs = seen[-COUNT:]
    return graph, node_ptrs


def idle_ms(graph) -> float:
    """ms per call of one replay launched on an idle device (events around it, then a synchronize)."""
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    graph.graph.replay()
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end)) / graph.count


def replay_us(graph, reps=15) -> float:
    return statistics.median(idle_ms(graph) for _ in range(reps)) * 1e3


def traced(graph) -> tuple[float, float, float]:
    """(busy us per call, floor gap us, median gap us) of one traced replay."""
    spans = device_spans(profiled(graph.graph.replay), torch.autograd.DeviceType.CUDA)
    gaps = [b[0] - a[1] for a, b in zip(spans, spans[1:])]
    return busy_ns(spans) / graph.count / 1e3, floor_gap_ns(spans) / 1e3, statistics.median(gaps) / 1e3


def describe_ptrs(ptrs) -> str:
    distinct = sorted(set(ptrs))
    return f"{len(distinct)} address(es), first %2MiB={distinct[0] % (2 << 20):#x}"


def main() -> None:
    x = torch.randn(1 << 20, device="cuda", dtype=torch.bfloat16)
    y = torch.randn_like(x)
    call = lambda: torch.add(x, y)  # noqa: E731
    print(f"device {torch.cuda.get_device_name()} torch {torch.__version__} count {COUNT}")
    t0 = truth_us(call)
    print(f"truth before: {t0:.3f} us  ({sm_clock()})")

    print("\n== kept: 8 captures, one shared pool, round-robin over 6 rounds (us per call, +% over truth)")
    pool = torch.cuda.graph_pool_handle()
    kept = [capture(x, y, pool) for _ in range(8)]
    for graph, _ in kept:
        for _ in range(20):
            graph.graph.replay()
    torch.cuda.synchronize()
    rounds = []
    for r in range(6):
        row = [replay_us(graph) for graph, _ in kept]
        rounds.append(row)
        print(f"  round {r} ({sm_clock()}): " + " ".join(f"{v / t0 - 1:+6.1%}" for v in row))
    for i, (graph, ptrs) in enumerate(kept):
        busy, floor, med = traced(graph)
        col = [row[i] for row in rounds]
        print(f"  capture {i}: median {statistics.median(col):.3f} us ({statistics.median(col) / t0 - 1:+.1%}) "
              f"spread {min(col):.3f}-{max(col):.3f}; traced busy {busy:.3f} gap floor {floor:.3f} med {med:.3f}; "
              f"{describe_ptrs(ptrs)}")
    del kept
    log("kept done")

    print("\n== private: 6 captures, own pool each, deleted before the next")
    for i in range(6):
        graph, ptrs = capture(x, y, None)
        for _ in range(20):
            graph.graph.replay()
        torch.cuda.synchronize()
        ev = replay_us(graph, 30)
        busy, floor, med = traced(graph)
        print(f"  capture {i}: {ev:.3f} us ({ev / t0 - 1:+.1%}); traced busy {busy:.3f} gap floor {floor:.3f} "
              f"med {med:.3f}; {describe_ptrs(ptrs)}")
        del graph
    log("private done")

    print("\n== out= into preallocated buffers (one graph per buffer)")
    for label, out in (("fresh empty_like", torch.empty_like(x)), ("fresh empty_like 2", torch.empty_like(x)),
                       ("slice +4 KiB of a larger buffer", torch.empty(2 * x.numel(), device="cuda",
                                                                        dtype=x.dtype)[2048:2048 + x.numel()])):
        graph = CapturedGraph([Call(lambda o=out: torch.add(x, y, out=o))], COUNT)
        for _ in range(20):
            graph.graph.replay()
        torch.cuda.synchronize()
        ev = replay_us(graph, 30)
        busy, floor, med = traced(graph)
        print(f"  {label}: {ev:.3f} us ({ev / t0 - 1:+.1%}); traced busy {busy:.3f} gap floor {floor:.3f} med {med:.3f}")
        del graph
    more(x, y, t0)
    switching(x, y)
    queued(x, y, t0)
    after_profiler(x, y, t0)
    t1 = truth_us(call)
    print(f"\ntruth after: {t1:.3f} us ({t1 / t0 - 1:+.1%} vs before)  ({sm_clock()})")


def more(x, y, t0) -> None:
    """Graph size, graphs alive, cycling between captures, and whether an empty-kernel graph's per-node time
    moves with the add's over time (interleaved replays)."""
    print("\n== size: us per call by nodes per graph (one graph alive)")
    for count in (250, 1000, 2500, 5000):
        graph = CapturedGraph([Call(lambda: torch.add(x, y))], count)
        for _ in range(20):
            graph.graph.replay()
        torch.cuda.synchronize()
        ev = replay_us(graph, 30)
        print(f"  {count:5d} nodes: {ev:.3f} us ({ev / t0 - 1:+.1%})")
        del graph
    print("\n== alive: one capture alone, then with 7 more alive, then cycled replay by replay")
    pool = torch.cuda.graph_pool_handle()
    first = CapturedGraph([Call(lambda: torch.add(x, y))], COUNT, pool)
    for _ in range(20):
        first.graph.replay()
    alone = replay_us(first, 30)
    others = [CapturedGraph([Call(lambda: torch.add(x, y))], COUNT, pool) for _ in range(7)]
    with_others = replay_us(first, 30)
    cycled = statistics.median(idle_ms(g) for _ in range(10) for g in [first] + others) * 1e3
    again = replay_us(first, 30)
    print(f"  alone {alone:.3f} ({alone / t0 - 1:+.1%}); 7 more alive {with_others:.3f} ({with_others / t0 - 1:+.1%}); "
          f"cycled {cycled:.3f} ({cycled / t0 - 1:+.1%}); consecutive again {again:.3f} ({again / t0 - 1:+.1%})")
    del others
    print("\n== track: add graph and empty-kernel graph replayed in turn, 400 pairs (us per node)")
    empty = CapturedGraph([Call(torch.cuda._sleep, (0,))], COUNT)
    pairs = []
    for _ in range(400):
        pairs.append((idle_ms(first) * 1e3, idle_ms(empty) * 1e3))
    for b in range(8):
        chunk = pairs[b * 50:(b + 1) * 50]
        a = statistics.median(p[0] for p in chunk)
        e = statistics.median(p[1] for p in chunk)
        print(f"  pairs {b * 50:3d}-{b * 50 + 49}: add {a:.3f} ({a / t0 - 1:+.1%})  empty {e:.3f}  add-empty {a - e:.3f}")
    adds = [p[0] for p in pairs]
    empties = [p[1] for p in pairs]
    try:
        print(f"  correlation add vs empty per pair: {statistics.correlation(adds, empties):+.2f}")
    except statistics.StatisticsError as exc:
        print(f"  correlation n/a: {exc}")
    spans = device_spans(profiled(empty.graph.replay), torch.autograd.DeviceType.CUDA)
    print(f"  empty kernel traced duration {statistics.median(e - s for s, e in spans) / 1e3:.3f} us; "
          f"truth of an empty kernel host launched {truth_us(lambda: torch.cuda._sleep(0)):.3f} us")
    log("more done")


def switching(x, y) -> None:
    """Does a graph's first replay after another graph's replays read slower (a switch cost), and by how
    much per node, for the add graph (2500 nodes) and empty-kernel graphs of 1000 and 2000 nodes?"""
    add = CapturedGraph([Call(lambda: torch.add(x, y))], COUNT)
    empties = {n: CapturedGraph([Call(torch.cuda._sleep, (0,))], n) for n in (1000, 2000)}
    for g in [add, *empties.values()]:
        for _ in range(20):
            g.graph.replay()
    torch.cuda.synchronize()

    def series(graph, n):
        return [idle_ms(graph) * 1e3 for _ in range(n)]

    print("\n== switching: us per node, replays in a row (first ones after a switch)")
    for n, empty in empties.items():
        rows = []
        for _ in range(10):
            before = series(add, 8)
            after = series(empty, 4)
            back = series(add, 4)
            rows.append((before, after, back))
        med = lambda k, i: statistics.median(r[k][i] for r in rows)  # noqa: E731
        print(f"  empty {n}: after 8 adds, empty replays 1-4: " + " ".join(f"{med(1, i):.3f}" for i in range(4))
              + "; add replays 1-4 after them: " + " ".join(f"{med(2, i):.3f}" for i in range(4))
              + f"; add in a row (5-8): {statistics.median(v for r in rows for v in r[0][4:]):.3f}")
        alt = [(idle_ms(add) * 1e3, idle_ms(empty) * 1e3) for _ in range(40)]
        print(f"  empty {n}: alternating one by one: add {statistics.median(a for a, _ in alt):.3f} "
              f"empty {statistics.median(e for _, e in alt):.3f}")
    log("switching done")


def queued(x, y, t0) -> None:
    """A replay launched on an idle device against the same replay queued behind an untimed lead replay
    (CapturedGraph.time_replay), alternated, for the add and an empty kernel."""
    print("\n== queued: us per call, idle-launched vs queued behind a lead replay (alternated, 40 each)")
    for label, body in (("add", lambda: torch.add(x, y)), ("empty", lambda: torch.cuda._sleep(0))):
        graph = CapturedGraph([Call(body)], COUNT)
        pairs = [(idle_ms(graph) * 1e3, graph.time_replay() * 1e3) for _ in range(40)]
        idle, lead = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
        rel = f" (idle {idle / t0 - 1:+.1%}, queued {lead / t0 - 1:+.1%} over truth)" if label == "add" else ""
        spans = graph.queued_spans()
        print(f"  {label}: idle {idle:.3f}  queued {lead:.3f}{rel}; traced queued busy "
              f"{busy_ns(spans) / graph.count / 1e3:.3f} floor gap {floor_gap_ns(spans) / 1e3:.3f}")
    log("queued done")


def after_profiler(x, y, t0) -> None:
    """Queued replays of the add before a profiler session and in 0.25 s windows after it."""
    import time

    graph = CapturedGraph([Call(lambda: torch.add(x, y))], COUNT)
    base = statistics.median(graph.time_replay() * 1e3 for _ in range(40))
    profiled(graph.graph.replay)
    start, rows = time.perf_counter(), []
    while time.perf_counter() - start < 3.0:
        rows.append((time.perf_counter() - start, graph.time_replay() * 1e3))
    print(f"\n== after a profiler session: queued add us per call (before: {base:.3f}, {base / t0 - 1:+.1%})")
    for w in range(12):
        values = [v for t, v in rows if w * 0.25 <= t < (w + 1) * 0.25]
        if values:
            m = statistics.median(values)
            print(f"  {w * 0.25:4.2f}-{(w + 1) * 0.25:4.2f} s: {m:.3f} ({m / t0 - 1:+.1%}), {len(values)} replays")
    log("after profiler done")


if __name__ == "__main__":
    main()
