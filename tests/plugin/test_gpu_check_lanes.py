"""scripts/gpu_check.py on a machine of several GPUs, on a CPU: a lane per GPU, each lane's processes on their
own GPU and cores, every lane's results merged into the one record, a stop that keeps what finished and leaves
no process behind, and plans for N GPUs. The device is a stand-in (test_gpu_check_script.StandIn)."""

from __future__ import annotations

import _thread
import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest
from test_gpu_check_script import ALL, READS, StandIn, gpu_check, gpu_record, gpu_stages  # noqa: F401 - fixtures

#: a child that reports what a lane's process sees: its GPU and the cores it may run on
REPORT = ("import json, os, sys; json.dump({'gpu': os.environ.get('CUDA_VISIBLE_DEVICES'), "
          "'cpus': sorted(os.sched_getaffinity(0))}, open(sys.argv[1], 'w'))")


@pytest.fixture
def two_gpus(tmp_path, gpu_check, gpu_record, gpu_stages, monkeypatch) -> StandIn:
    stand_in = StandIn(tmp_path, gpu_check, gpu_record, gpu_stages, monkeypatch)
    stand_in.env["device_count"] = 2
    return stand_in


def two_cores() -> list[int]:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two cores to give two lanes one each")
    return cpus


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def reporting(stand_in: StandIn, gpu_stages, seen: dict[str, dict]):
    """Stand-in runners that also start a real process through the stages' launcher, which reports its GPU and
    cores, and note when each ran."""
    tests, whole = stand_in.run_tests, stand_in.run_whole

    def report(name: str, logs: Path, recorded) -> None:
        out = logs / f"{name}.seen.json"
        started = time.monotonic()
        code, _ = gpu_stages.run_logged([sys.executable, "-c", REPORT, str(out)], logs / f"{name}.seen.log", 60,
                                        recorded.bare_env())
        time.sleep(0.5)  # long enough for the other lane's part to overlap it when the lanes run in parallel
        assert code == 0, (logs / f"{name}.seen.log").read_text()
        seen[name] = {**json.loads(out.read_text()), "span": (started, time.monotonic())}

    def run_tests(stage, units, logs, recorded):
        report(stage.name, logs, recorded)
        return tests(stage, units, logs, recorded)

    def run_whole(stage, unit, arch, logs, out, recorded):
        report(unit, logs, recorded)
        return whole(stage, unit, arch, logs, out, recorded)

    return run_tests, run_whole


# -- lanes: their GPU and cores -------------------------------------------------------------------------------

def test_each_lane_gets_its_own_gpu_and_an_equal_slice_of_the_cores(gpu_check) -> None:
    lanes = gpu_check.gpu_lanes.machine_lanes(8, cpus=range(128), visible="")
    assert [lane.device for lane in lanes] == [str(i) for i in range(8)]
    assert all(len(lane.cpus) == 16 for lane in lanes)
    assert sorted(cpu for lane in lanes for cpu in lane.cpus) == list(range(128))  # disjoint, all used
    renumbered = gpu_check.gpu_lanes.machine_lanes(2, cpus=range(32), visible="4,6")
    assert [lane.device for lane in renumbered] == ["4", "6"]  # the GPUs this process was given
    most = gpu_check.gpu_stages.PLUGIN_WORKERS
    assert gpu_check.gpu_stages.plugin_workers(60, lanes[0]) == most
    assert gpu_check.gpu_stages.plugin_workers(60, gpu_check.gpu_lanes.Lane(0, "0", (0, 1, 2))) == 3
    assert gpu_check.gpu_stages.plugin_workers(60, None) == most and gpu_check.gpu_stages.plugin_workers(2, None) == 2


def test_every_process_of_a_lane_sees_only_its_gpu_and_runs_on_its_cores(two_gpus, gpu_stages, monkeypatch) -> None:
    cpus = two_cores()
    seen: dict[str, dict] = {}
    run_tests, run_whole = reporting(two_gpus, gpu_stages, seen)
    monkeypatch.setattr(gpu_stages, "run_tests", run_tests)
    monkeypatch.setattr(gpu_stages, "run_whole", run_whole)
    assert two_gpus.main("--changed") == 0 and sorted(two_gpus.take()) == sorted(ALL)
    assert set(seen) == {"t", "bench", "loop"}
    lanes = {name: (found["gpu"], tuple(found["cpus"])) for name, found in seen.items()}
    first, second = two_gpus.gpu_check.gpu_lanes.cpu_slices(cpus, 2)  # half the cores each (one on two cores)
    assert set(lanes.values()) == {("0", first), ("1", second)} and not set(first) & set(second)
    loop, bench = seen["loop"]["span"], seen["bench"]["span"]
    assert lanes["loop"] != lanes["bench"] and loop[0] < bench[1] and bench[0] < loop[1]  # they ran side by side
    assert {p.name for p in two_gpus.logs.glob("lane-*/record-*")} == {"record-t", "record-bench", "record-loop"}


def test_one_gpu_runs_every_part_in_turn_with_the_machines_own_environment(two_gpus, gpu_stages,
                                                                           monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    seen: dict[str, dict] = {}
    run_tests, run_whole = reporting(two_gpus, gpu_stages, seen)
    monkeypatch.setattr(gpu_stages, "run_tests", run_tests)
    monkeypatch.setattr(gpu_stages, "run_whole", run_whole)
    assert two_gpus.main("--changed", "--gpus", "1") == 0
    assert [s for s, _ in two_gpus.take()] == ["t", "t", "t", "bench", "loop"]  # stage order, one at a time
    assert {found["gpu"] for found in seen.values()} == {"3"}
    assert {tuple(found["cpus"]) for found in seen.values()} == {tuple(sorted(os.sched_getaffinity(0)))}
    assert not list(two_gpus.logs.glob("lane-*"))


# -- lanes: one record ------------------------------------------------------------------------------------------

def unit_inputs(data: dict) -> dict[str, set[str]]:
    """Each unit's inputs, as paths, from a record's entries and its paths table."""
    return {eid.split("@")[0]: {data["paths"][i] for i in entry["inputs"]}
            for stage in data["stages"].values() for eid, entry in stage["units"].items()}


def test_every_lanes_results_are_merged_into_the_one_record(two_gpus, gpu_stages, monkeypatch, capsys) -> None:
    in_turn = two_gpus.record
    assert two_gpus.main("--changed", "--gpus", "1") == 0 and sorted(two_gpus.take()) == sorted(ALL)
    two_gpus.record = in_turn.with_name("lanes.json")
    tests, whole, both_busy, lanes_met = two_gpus.run_tests, two_gpus.run_whole, threading.Barrier(2, timeout=30), set()

    def meet() -> None:  # each lane's first part waits for the other lane's: both lanes are busy at once
        if threading.current_thread().name not in lanes_met:
            lanes_met.add(threading.current_thread().name)
            both_busy.wait()

    monkeypatch.setattr(gpu_stages, "run_tests", lambda *args: (meet(), tests(*args))[1])
    monkeypatch.setattr(gpu_stages, "run_whole", lambda *args: (meet(), whole(*args))[1])
    assert two_gpus.main("--changed") == 0 and sorted(two_gpus.take()) == sorted(ALL)
    data = two_gpus.data()
    assert unit_inputs(data) == unit_inputs(json.loads(in_turn.read_text()))  # what each unit read, as on one GPU
    assert all(unit_inputs(data)[unit] >= {*READS[unit.split("[")[0]]} for _, unit in ALL)
    assert data["stages"]["bench"]["units"]["bench@NVIDIA H200"]["provenance"]["lanes_beside"] == 1
    assert "lanes_beside" not in data["stages"]["loop"]["units"]["loop"]["provenance"]  # not a benchmark
    capsys.readouterr()
    assert two_gpus.main("--verify") == 0  # every key recomputed from the tree matches
    (two_gpus.root / "src" / "lib" / "judge.py").write_text("J = 2\n")
    assert two_gpus.main("--changed") == 0 and two_gpus.take() == [("loop", "loop")]


def test_a_stop_mid_call_keeps_the_finished_units_and_leaves_no_process(two_gpus, gpu_stages, monkeypatch,
                                                                         ctrl_c_delivered) -> None:
    """SIGINT (the device call's limit) while the loop's lane runs a process group: the benchmark that
    finished on the other lane stays in the record, the loop stays in debt, and no process of it is left."""
    pids = two_gpus.logs.parent / "pids"
    whole = two_gpus.run_whole
    long_run = ("import os, subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', "
                "'import time; time.sleep(120)']); open(sys.argv[1], 'w').write(f'{os.getpid()} {child.pid}'); "
                "time.sleep(120)")

    def run_whole(stage, unit, arch, logs, out, recorded):
        if unit != "loop":
            return whole(stage, unit, arch, logs, out, recorded)
        gpu_stages.run_logged([sys.executable, "-c", long_run, str(pids)], logs / "loop.log", 300, recorded.bare_env())
        return whole(stage, unit, arch, logs, out, recorded)  # what a run killed mid-way would report

    def interrupt_when_the_benchmark_is_merged() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            merged = two_gpus.record.exists() and "bench" in two_gpus.data().get("stages", {})
            if merged and pids.exists() and len(pids.read_text().split()) == 2:
                break
            time.sleep(0.05)
        _thread.interrupt_main()

    monkeypatch.setattr(gpu_stages, "run_whole", run_whole)
    threading.Thread(target=interrupt_when_the_benchmark_is_merged, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        two_gpus.main("--changed")
    started = [int(pid) for pid in pids.read_text().split()]
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in started) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in started)
    stages = two_gpus.data()["stages"]
    assert stages["bench"]["units"]["bench@NVIDIA H200"]["result"]["passed"] and "loop" not in stages
    monkeypatch.setattr(gpu_stages, "run_whole", whole)
    two_gpus.take()
    assert two_gpus.main("--changed") == 0 and two_gpus.take() == [("loop", "loop")]  # the debt it left


# -- planning for N GPUs -----------------------------------------------------------------------------------------

def judge_change(gpu_check, gpu_record) -> list:
    """What a change to the judge makes stale: the loop-family stages at their estimates and four plugin test
    files (the judge's row of the cost table)."""
    family = [gpu_record.UnitState(stage, unit, "debt") for stage in gpu_check.STAGES
              if stage.name in ("loop", "attacks", "empty", "classes") for unit in stage.units(gpu_check.ROOT)]
    plugin = gpu_check.BY_NAME["plugin"]
    tests = [gpu_record.UnitState(plugin, f"tests/plugin/test_{name}.py", "debt", seconds=seconds)
             for name, seconds in (("judge_real_lane", 93.0), ("judge_runs", 40.0), ("agent_loop", 30.0),
                                   ("judge_preflight", 20.0))]
    return family + tests


def test_a_judge_change_runs_its_units_eight_at_a_time_on_eight_gpus(gpu_check, gpu_record) -> None:
    """Each loop-family unit nearly fills a call (a baseline and a few judged experiments), so eight GPUs run
    eight of them per call, the plugin's files in the room left beside them."""
    states = judge_change(gpu_check, gpu_record)
    family = [s for s in states if s.stage.name != "plugin"]
    one = gpu_check.plan_summary({}, states)
    eight = gpu_check.plan_summary({}, states, gpus=8)
    assert len(one["calls"]) >= len(family)  # one GPU: a call per unit
    assert len(eight["calls"]) == -(-len(family) // 8)
    assert all(call["seconds"] <= gpu_check.CALL_LIMIT_S - gpu_check.CALL_MARGIN_S for call in eight["calls"])
    assert sorted(u for c in eight["calls"] for p in c["parts"] for u in p["units"]) == sorted(s.unit for s in states)
    assert eight["stage_s"] == pytest.approx(one["stage_s"])  # the same work, side by side
    assert eight["device_s"] < one["device_s"] / 5


def test_every_lane_fits_its_call_and_the_longest_parts_go_first(gpu_check, gpu_record) -> None:
    states = judge_change(gpu_check, gpu_record)
    capacity = gpu_check.stage_capacity(gpu_check.CALL_LIMIT_S)
    calls = gpu_check.pack_lanes({}, states, capacity, 4)
    family = [s for s in states if s.stage.name != "plugin"]
    assert all(len(call) == 4 for call in calls) and len(calls) == -(-len(family) // 4)
    assert all(sum(p.seconds for p in lane) <= capacity for call in calls for lane in call)
    placed = [u.unit for call in calls for lane in call for p in lane for u in p.units]
    assert sorted(placed) == sorted(s.unit for s in states)
    longest = sorted(states, key=gpu_check.unit_seconds, reverse=True)[:4]
    assert {p.units[0].unit for lane in calls[0] for p in lane[:1]} == {s.unit for s in longest}
    summary = gpu_check.plan_summary({}, states, gpus=4)
    assert summary["device_s"] == pytest.approx(sum(c["seconds"] for c in summary["calls"]) + gpu_check.MACHINE_START_S)
    assert all(c["seconds"] == pytest.approx(max(c["lane_s"]) + gpu_check.CALL_SETUP_S) for c in summary["calls"])


def test_one_gpu_plans_exactly_todays_calls(gpu_check, gpu_record, tmp_path) -> None:
    record = gpu_check.load_record(gpu_check.RESULT)
    states = gpu_check.with_legacy_times(record, gpu_record.states(record, gpu_check.STAGES, gpu_check.ROOT))
    capacity = gpu_check.stage_capacity(gpu_check.CALL_LIMIT_S)
    today = [[{"stage": p.stage.name, "units": [u.unit for u in p.units], "seconds": round(p.seconds, 1)}
              for p in call if p.units] for call in gpu_check.pack(record, gpu_check.due(states), capacity)]
    summary = gpu_check.plan_summary(record, states, gpus=1)
    assert [call["parts"] for call in summary["calls"]] == today
    assert [call["lanes"] for call in summary["calls"]] == [[parts] for parts in today]
    default, one = tmp_path / "default.json", tmp_path / "one.json"
    assert gpu_check.main(["--plan", "--json", str(default)]) == 0
    assert gpu_check.main(["--plan", "--gpus", "1", "--json", str(one)]) == 0
    assert json.loads(default.read_text()) == json.loads(one.read_text())
