"""benchmarks/timer_fidelity.py's judgement on recorded rounds (no GPU): auto is held to the end-to-end truth on
every case, cupti to host-launched kernel time, which CUPTI truth a graph reading is held to, and that a
perturbed in-graph trace is never used as truth."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def fidelity(load_benchmark):
    return load_benchmark("timer_fidelity")


def rounds(truth: float, in_graph: float, replay: float, graph: float, dbcg: float, cupti: float,
           e2e: float | None = None, auto: float | None = None) -> list[dict]:
    e2e = truth * 1.01 if e2e is None else e2e
    row = {"truth_ms": truth, "truth_graph_ms": in_graph, "replay_graph_ms": replay, "cupti_ms": cupti,
           "cupti_cv": 0.001, "graph_ms": graph, "graph_cv": 0.001, "do_bench_cudagraph_ms": dbcg, "e2e_ms": e2e,
           "auto_ms": e2e if auto is None else auto, "auto_cv": 0.001}
    return [dict(row) for _ in range(3)]


def targets(fidelity, name: str, rows: list[dict]) -> dict[str, dict]:
    results = {"fidelity": {name: {"runs": [fidelity.summarize(rows)]}}}
    return {t["name"].split(": ", 1)[1]: t for t in fidelity.run_targets(results, 0)}


def test_perturbed_in_graph_trace_is_not_judged_against(fidelity) -> None:
    # an H200 host: the copy's traced in-graph kernels sum 10 % over the untraced replay they ran in
    found = targets(fidelity, "copy_256MB", rounds(0.1281, 0.1406, 0.1265, 0.1262, 0.1276, 0.1263))
    close = found["graph as close as do_bench_cudagraph (CUPTI in graph)"]
    assert close["pass"] is None and "tracing slowed them" in close["shown"]
    within = found["graph within 5% of CUPTI"]
    assert within["pass"] and "in a graph" not in within["shown"]  # the host-launched truth


def test_sound_in_graph_trace_is_judged(fidelity) -> None:
    # LayerNorm on the same host: kernels 4.7 % faster in a graph, the graph reading 0.5 % from them
    found = targets(fidelity, "layernorm_16x256x1152", rounds(0.0116, 0.01106, 0.01100, 0.01101, 0.01126, 0.0113))
    within = found["graph within 5% of CUPTI"]
    assert within["pass"] and "in a graph" in within["shown"] and within["value"] < 0.01
    assert found["graph as close as do_bench_cudagraph (CUPTI in graph)"]["pass"] is True


def test_graph_reading_far_from_both_truths_fails(fidelity) -> None:
    found = targets(fidelity, "layernorm_16x256x1152", rounds(0.0116, 0.01106, 0.01100, 0.0125, 0.01126, 0.0113))
    assert found["graph within 5% of CUPTI"]["pass"] is False
    assert found["graph as close as do_bench_cudagraph (CUPTI in graph)"]["pass"] is False


def test_graph_further_than_do_bench_cudagraph_fails_on_a_sound_trace(fidelity) -> None:
    found = targets(fidelity, "copy_256MB", rounds(0.1281, 0.1270, 0.1275, 0.1220, 0.1268, 0.1263))
    assert found["graph as close as do_bench_cudagraph (CUPTI in graph)"]["pass"] is False


def test_cupti_is_held_to_host_launched_kernels(fidelity) -> None:
    found = targets(fidelity, "layernorm_16x256x1152", rounds(0.0116, 0.01106, 0.01100, 0.01101, 0.01126, 0.0110))
    assert found["cupti within 5% of CUPTI"]["pass"] is False  # 5.2 % from host-launched, 0.5 % in a graph


def test_auto_is_held_to_what_the_caller_waits_for_on_every_case(fidelity) -> None:
    """A launch-bound add: kernels 1.8 us, 6.2 us a call end to end. auto reads the latency and passes; a
    reading of the kernel time would miss by 70 %. A call that synchronises in its middle: kernel time is
    reported against the end-to-end truth, never judged, and auto is held to the end to end."""
    add = targets(fidelity, "add_1M_bf16", rounds(0.0018, 0.0018, 0.0018, 0.0018, 0.0018, 0.0018, e2e=0.0062,
                                                  auto=0.0061))
    assert add["auto within 5% of end to end"]["pass"] is True and add["cupti within 5% of CUPTI"]["pass"] is True
    busy = targets(fidelity, "add_1M_bf16", rounds(0.0018, 0.0018, 0.0018, 0.0018, 0.0018, 0.0018, e2e=0.0062,
                                                   auto=0.0019))
    assert busy["auto within 5% of end to end"]["pass"] is False
    row = {"truth_ms": 0.040, "e2e_ms": 0.080, "auto_ms": 0.081, "auto_cv": 0.03, "cupti_ms": 0.040,
           "cupti_cv": 0.01, "do_bench_ms": 0.079, "auto_idle_fraction": 0.5, "auto_host_syncs": 1}
    sync = targets(fidelity, "sync_mid_call", [dict(row) for _ in range(3)])
    auto = sync["auto within 5% of end to end"]
    assert auto["pass"] is True and "50% idle, host syncs: 1" in auto["shown"]
    assert sync["cupti against end to end"]["pass"] is None and "50.0% off" in sync["cupti against end to end"]["shown"]
    assert "auto CV < 2%" not in sync and "cupti within 5% of CUPTI" not in sync


def test_graph_against_do_bench_cudagraph_is_judged_once_over_every_run(fidelity) -> None:
    """Both errors sit below 1 % on the copy, and one run's three rounds spread wider than the half-point
    margin: an H200 check read 0.89 % vs 0.28 %, then 0.32 % vs 0.93 % and 0.52 % vs 0.82 %. The comparison
    is the median over all rounds of all runs, shown per run; a mechanism further off in every run fails."""
    def run(graph_ms: float, dbcg_ms: float) -> dict:
        return fidelity.summarize(rounds(0.1281, 0.1270, 0.1275, graph_ms, dbcg_ms, 0.1263))

    def judged(runs: list[dict]) -> list[dict]:
        results = {"fidelity": {"copy_256MB": {"runs": runs}}}
        return [t for t in fidelity.target_records(results) if "as close as" in t["name"]]

    noisy = [run(0.1270 * 1.0089, 0.1270 * 1.0028), run(0.1270 * 1.0032, 0.1270 * 1.0093),
             run(0.1270 * 1.0052, 0.1270 * 1.0082)]
    (close,) = judged(noisy)
    assert close["pass"] and close["passed_runs"] == "1/1" and "over 9 rounds" in close["shown"][0]
    worse = [run(0.1270 * 1.012, 0.1270 * 1.003) for _ in range(3)]
    assert not judged(worse)[0]["pass"]


def test_the_pooled_comparison_is_judged_when_only_later_runs_have_a_sound_trace(fidelity) -> None:
    """The comparison over every run's rounds does not hang on run 0: a first run whose trace tracing slowed
    (not judged) leaves the other runs' rounds to judge, and a graph reading further off still fails."""
    perturbed = fidelity.summarize(rounds(0.1281, 0.1406, 0.1265, 0.1262, 0.1276, 0.1263))

    def judged(graph_ms: float) -> dict:
        sound = fidelity.summarize(rounds(0.1281, 0.1270, 0.1275, graph_ms, 0.1270 * 1.003, 0.1263))
        results = {"fidelity": {"copy_256MB": {"runs": [perturbed, sound, sound]}}}
        (close,) = [t for t in fidelity.target_records(results) if "as close as" in t["name"]]
        return close

    close = judged(0.1270 * 1.004)
    assert close["pass"] and close["passed_runs"] == "1/1" and "over 6 rounds" in " ".join(close["shown"])
    assert judged(0.1270 * 1.012)["pass"] is False


def test_the_sm_clock_of_the_truth_and_of_auto_is_reported_beside_them(fidelity) -> None:
    # an H100: a matmul timed by auto's sustained batches reads 18 % over the end-to-end truth's 20-ms burst;
    # the clocks say whether the device throttled between them (information, never judged)
    rows = rounds(0.187, 0.19, 0.19, 0.189, 0.206, 0.192, e2e=0.179, auto=0.212)
    for row in rows:
        row["e2e_sm_mhz"], row["auto_sm_mhz"] = [1980, 1980], [1980, 1755]
    found = targets(fidelity, "matmul_4096_bf16", rows)
    assert found["SM clock"]["pass"] is None and found["SM clock"]["shown"] == "end to end 1980->1980, auto 1980->1755 MHz"
    assert "SM clock" not in targets(fidelity, "matmul_4096_bf16", rounds(0.187, 0.19, 0.19, 0.189, 0.206, 0.192))


def test_the_end_to_end_truth_is_the_median_of_its_bursts(load_benchmark, monkeypatch) -> None:
    # one burst of five stalls on the host (as a launch-bound add's truth did in a round on an H100, 45 % off):
    # the truth is the other bursts' time, not the stall's
    import torch

    harness = load_benchmark("harness")
    clock = {"now": 0.0, "calls": 0}

    def fn() -> None:
        clock["calls"] += 1
        clock["now"] += 0.010 if 60 <= clock["calls"] < 70 else 0.001  # calls 55-104 are the second burst

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr("time.perf_counter", lambda: clock["now"])
    assert harness.end_to_end_ms(fn, total_ms=50.0, bursts=5) == pytest.approx(1.0)
    clock.update(now=0.0, calls=0)
    assert harness.end_to_end_ms(fn, total_ms=50.0) == pytest.approx(1.0)  # one burst, before the stall


def test_auto_cv_is_judged_where_the_device_stays_busy_and_reported_where_it_waits_for_the_host(fidelity) -> None:
    # an H100 host: the 2-us add launches every 7.0-8.7 us, the device idle 73 % of the latency, and auto's
    # samples spread 2.7-9.3 % with the host's launch jitter; a matmul keeps the device busy and is judged
    waiting = rounds(0.00196, 0.0018, 0.0018, 0.0018, 0.0018, 0.00196, e2e=0.0078, auto=0.0078)
    busy = rounds(0.187, 0.19, 0.19, 0.189, 0.206, 0.192, e2e=0.19, auto=0.19)
    for row in waiting:
        row.update(auto_cv=0.06, auto_idle_fraction=0.73)
    for row in busy:
        row.update(auto_cv=0.03, auto_idle_fraction=0.0)
    add = targets(fidelity, "add_1M_bf16", waiting)["auto CV < 2%"]
    assert add["pass"] is None and "not judged: launch-bound here (73% idle)" in add["shown"]
    assert targets(fidelity, "copy_256MB", busy)["auto CV < 2%"]["pass"] is False
