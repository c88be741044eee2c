"""scripts/gpu_check.py on a CPU: units and their keys, --verify (green, red, debt), --plan's calls, and how
--changed runs only the units a change reaches, with a stand-in device, stand-in runners and recordings."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.py"
H200 = {"device": "NVIDIA H200", "arch": "sm_90", "torch": "2.11.0+cu130", "cuda": "13.0", "triton": "3.6.0",
        "python": "3.12", "python_full": "3.12.3", "driver": "580.159.04", "memory_gb": 139.8,
        "packages": {"diffusers": "0.42.1", "quack-kernels": "0.6.5"}}
H100 = {**H200, "device": "NVIDIA H100 80GB HBM3", "memory_gb": 79.2, "driver": "580.159.03"}


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gpu_record(gpu_check):
    return sys.modules["gpu_record"]


@pytest.fixture(scope="module")
def gpu_stages(gpu_check):
    return sys.modules["gpu_stages"]


# -- this repository's stages ----------------------------------------------------------------------------

def test_every_test_file_is_a_unit_of_exactly_one_test_stage(gpu_check, gpu_inputs_module) -> None:
    every = set(gpu_inputs_module.walk_tests(ROOT, ["tests"]))
    owners: dict[str, list[str]] = {}
    for stage in gpu_check.STAGES:
        for unit in stage.units(ROOT):
            owners.setdefault(unit, []).append(stage.name)
    tests = {u: s for u, s in owners.items() if u.startswith("tests/")}
    assert set(tests) == every and all(len(s) == 1 for s in tests.values()), {u: s for u, s in tests.items() if len(s) != 1}
    assert owners["tests/gates/test_tolerance_corpus_gpu.py"] == ["corpus"]
    assert owners["tests/plugin/test_report.py"] == ["plugin"] and owners["tests/dit_fast/test_fast_gpu.py"] == ["suites"]
    assert {s.name for s in gpu_check.STAGES if s.kind == "whole"} == {"fidelity", "kernels", "dit", "memory",
                                                                        "switches", "probe_cost", "loop", "attacks",
                                                                        "empty", "classes"}
    assert {s.name for s in gpu_check.STAGES if s.per_device} == {"fidelity", "kernels", "dit", "memory", "switches",
                                                                  "probe_cost"}


@pytest.fixture(scope="module")
def gpu_inputs_module(gpu_check):
    return sys.modules["gpu_inputs"]


# -- a stand-in project, device and runners ------------------------------------------------------------------

TREE = {
    "pyproject.toml": "[project]\n",
    "conftest.py": "",
    "src/lib/__init__.py": "",
    "src/lib/core.py": "X = 1\n",
    "src/lib/judge.py": "J = 1\n",
    "kernels/k.cu": "// k\n",
    "tests/t/test_a.py": "def test_a(): pass\n",
    "tests/t/test_b.py": "def test_b(): pass\n",
    "tests/t/test_q.py": "def test_q(): pass\n",
    "bench.py": "print(1)\n",
    "loop.py": "print(2)\n",
    "README.md": "docs\n",
}
#: what each unit's stand-in run reads (besides its own file)
READS = {
    "tests/t/test_a.py": ["src/lib/__init__.py", "src/lib/core.py"],
    "tests/t/test_b.py": ["src/lib/__init__.py", "src/lib/core.py", "kernels/k.cu"],
    "tests/t/test_q.py": ["src/lib/core.py"],
    "bench": ["bench.py", "kernels/k.cu", "src/lib/core.py"],
    "loop": ["loop.py", "src/lib/judge.py"],
}
#: units that look up an optional package
LOOKS_UP = {"tests/t/test_q.py": ["quack"]}


class StandIn:
    def __init__(self, tmp_path: Path, gpu_check, gpu_record, gpu_stages, monkeypatch) -> None:
        self.root = tmp_path / "tree"
        for rel, text in TREE.items():
            (self.root / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.root / rel).write_text(text)
        self.stages = [gpu_record.Stage("t", "tests", ("tests",), "pytest tests", 300, "rule", workers=2),
                       gpu_record.Stage("bench", "whole", ("bench.py",), "python bench.py", 100, "rule",
                                        per_device=True),
                       gpu_record.Stage("loop", "whole", ("loop.py",), "python loop.py", 200, "rule")]
        self.ran: list[tuple[str, str]] = []
        self.failing: set[str] = set()
        self.unrecorded: set[str] = set()
        self.edit_during: dict[str, str] = {}
        self.shard_targets: dict[str, dict] = {}
        self.env = dict(H200)
        self.record = tmp_path / "gpu_check.json"
        self.logs = tmp_path / "logs"
        self.gpu_check = gpu_check
        monkeypatch.setattr(gpu_check, "ROOT", self.root)
        monkeypatch.setattr(gpu_check, "STAGES", self.stages)
        monkeypatch.setattr(gpu_check, "BY_NAME", {s.name: s for s in self.stages})
        monkeypatch.setattr(gpu_check, "environment", lambda: dict(self.env))
        monkeypatch.setattr(gpu_stages, "run_tests", self.run_tests)
        monkeypatch.setattr(gpu_stages, "run_whole", self.run_whole)

    def _write(self, recorded, unit: str, tag: str) -> None:
        if unit in self.unrecorded:
            return
        lines = [{"k": "proc", "pid": os.getpid(), "unit": tag}]
        reads = READS.get(unit.split("[")[0], []) + ([unit] if unit.startswith("tests/") else [])  # a shard: its stage's
        lines += [{"k": "open", "u": tag, "p": str(self.root / rel)} for rel in reads]
        lines += [{"k": "mod", "u": tag, "n": name} for name in LOOKS_UP.get(unit, [])]
        path = recorded.folder / f"{abs(hash(unit))}.jsonl"
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))

    def _result(self, unit: str) -> dict:
        if unit in self.edit_during:
            (self.root / self.edit_during[unit]).write_text("edited during the run\n")
        passed = unit not in self.failing
        return {"passed": passed, "seconds": 20.0, "counts": {"passed": int(passed), "failed": int(not passed),
                                                              "skipped": 0, "errors": 0},
                "failures": [] if passed else [f"{unit}::test: boom"], "skips": []}

    def run_tests(self, stage, units, logs, recorded):
        for unit in units:
            self.ran.append((stage.name, unit))
            self._write(recorded, unit, str(self.root / unit))
        return {unit: self._result(unit) for unit in units}, 30.0

    def run_whole(self, stage, unit, arch, logs, out, recorded):
        self.ran.append((stage.name, unit))
        self._write(recorded, unit, unit)
        result = self._result(unit)
        if unit in self.shard_targets:
            result["targets"] = [self.shard_targets[unit]]
        return result

    def main(self, *args: str) -> int:
        return self.gpu_check.main([*args, "--record", str(self.record), "--logs", str(self.logs)])

    def take(self) -> list[tuple[str, str]]:
        ran, self.ran = self.ran, []
        return ran

    def data(self) -> dict:
        return json.loads(self.record.read_text())


@pytest.fixture
def stand_in(tmp_path, gpu_check, gpu_record, gpu_stages, monkeypatch) -> StandIn:
    return StandIn(tmp_path, gpu_check, gpu_record, gpu_stages, monkeypatch)


ALL = [("t", "tests/t/test_a.py"), ("t", "tests/t/test_b.py"), ("t", "tests/t/test_q.py"), ("bench", "bench"),
       ("loop", "loop")]


def test_verify_tells_recorded_debt_time_from_units_never_timed(stand_in, capsys) -> None:
    assert stand_in.main("--changed") == 0
    (stand_in.root / "tests" / "t" / "test_new.py").write_text("def test_new(): pass\n")
    capsys.readouterr()
    assert stand_in.main("--verify") == 3
    assert "1 debt (1 never timed)" in capsys.readouterr().out  # no time recorded: none claimed
    (stand_in.root / "tests" / "t" / "test_a.py").write_text("def test_a(): assert 1\n")
    assert stand_in.main("--verify") == 3
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("debt  t "))
    assert "2 debt (~" in line and line.endswith(" s of test time; 1 never timed)")


def test_a_change_runs_exactly_the_units_that_read_it(stand_in, capsys) -> None:
    assert stand_in.main("--changed") == 0 and sorted(stand_in.take()) == sorted(ALL)
    assert stand_in.main("--changed") == 0 and stand_in.take() == []  # nothing in debt: nothing runs
    (stand_in.root / "src" / "lib" / "judge.py").write_text("J = 2\n")
    assert stand_in.main("--verify") == 3 and "debt loop: edited src/lib/judge.py" in capsys.readouterr().out
    assert stand_in.main("--changed") == 0 and stand_in.take() == [("loop", "loop")]
    (stand_in.root / "kernels" / "k.cu").write_text("// edited\n")
    assert stand_in.main("--changed") == 0 and sorted(stand_in.take()) == [("bench", "bench"), ("t", "tests/t/test_b.py")]
    (stand_in.root / "tests" / "t" / "test_a.py").write_text("def test_a(): assert 1\n")
    assert stand_in.main("--changed") == 0 and stand_in.take() == [("t", "tests/t/test_a.py")]
    (stand_in.root / "README.md").write_text("new docs\n")  # no unit reads documentation
    (stand_in.root / "src" / "lib" / "unread.py").write_text("")  # nor a module nothing imports
    assert stand_in.main("--verify") == 0 and stand_in.main("--changed") == 0 and stand_in.take() == []
    (stand_in.root / "tests" / "t" / "test_new.py").write_text("def test_new(): pass\n")  # a new unit is debt
    assert stand_in.main("--changed") == 0 and stand_in.take() == [("t", "tests/t/test_new.py")]
    data = stand_in.data()
    assert data["schema"] == 3 and "key_scheme" in data and set(data["stages"]) == {"t", "bench", "loop"}


def test_correctness_results_hold_across_cards_and_benchmarks_are_kept_per_device(stand_in) -> None:
    """A record made on an H200 covers the same tree on an H100 (same arch and software): --changed there runs
    no test unit, and the reverse. Benchmarks are records of one device: the H200's holds on the H100 until
    its inputs change; then the H100 measures it, and each device keeps its own result."""
    assert stand_in.main("--changed") == 0 and len(stand_in.take()) == len(ALL)
    stand_in.env = dict(H100)
    assert stand_in.main("--changed") == 0 and stand_in.take() == []
    (stand_in.root / "bench.py").write_text("print(3)\n")
    assert stand_in.main("--changed") == 0 and stand_in.take() == [("bench", "bench")]
    units = stand_in.data()["stages"]["bench"]["units"]
    assert set(units) == {"bench@NVIDIA H200", "bench@NVIDIA H100 80GB HBM3"}
    assert units["bench@NVIDIA H100 80GB HBM3"]["environment"]["device"] == "NVIDIA H100 80GB HBM3"
    assert "device" not in stand_in.data()["stages"]["t"]["units"]["tests/t/test_a.py"]["environment"]
    assert stand_in.data()["stages"]["t"]["units"]["tests/t/test_a.py"]["provenance"]["device"] == "NVIDIA H200"
    stand_in.env = dict(H200)
    assert stand_in.main("--changed") == 0 and stand_in.take() == []
    stand_in.env = {**H200, "torch": "2.12.0"}  # what computes changed: every correctness unit is debt
    assert stand_in.main("--changed") == 0 and sorted(stand_in.take()) == sorted(u for u in ALL if u[0] != "bench")


def test_only_units_that_looked_up_an_optional_package_are_keyed_on_it(stand_in) -> None:
    assert stand_in.main("--changed") == 0 and len(stand_in.take()) == len(ALL)
    units = stand_in.data()["stages"]["t"]["units"]
    assert units["tests/t/test_q.py"]["environment"]["packages"] == {"quack-kernels": "0.6.5"}
    assert units["tests/t/test_a.py"]["environment"]["packages"] == {}
    stand_in.env = {**H200, "packages": {"diffusers": "0.42.1", "quack-kernels": None}}  # quack not staged
    assert stand_in.main("--changed") == 0 and stand_in.take() == [("t", "tests/t/test_q.py")]


def test_verify_tells_red_from_debt_and_a_red_unit_runs_again_only_with_a_reason(stand_in, capsys) -> None:
    stand_in.failing.add("tests/t/test_b.py")
    assert stand_in.main("--changed") == 1
    stand_in.take()
    out = capsys.readouterr().out
    assert "red, not run again without --rerun STAGE=WHY: t: tests/t/test_b.py" in out
    assert stand_in.main("--verify") == 1 and "red tests/t/test_b.py: tests/t/test_b.py::test: boom" in capsys.readouterr().out
    assert stand_in.main("--changed") == 1 and stand_in.take() == []  # red is not retried silently
    with pytest.raises(SystemExit):
        stand_in.main("--rerun", "t")  # no reason
    stand_in.failing.clear()
    assert stand_in.main("--rerun", "t=the host was loaded by another job") == 0
    assert stand_in.take() == [("t", "tests/t/test_b.py")]
    entry = stand_in.data()["stages"]["t"]["units"]["tests/t/test_b.py"]
    assert entry["result"]["passed"] and entry["superseded"][0]["reason"] == "the host was loaded by another job"
    assert entry["superseded"][0]["result"]["failures"] == ["tests/t/test_b.py::test: boom"]
    (stand_in.root / "kernels" / "k.cu").write_text("// fixed\n")
    assert stand_in.main("--verify") == 3  # a red unit whose input changed is debt again, not red
    assert stand_in.main("--changed") == 0
    assert "superseded" not in stand_in.data()["stages"]["t"]["units"]["tests/t/test_b.py"]  # a new key starts afresh


def test_a_unit_whose_reads_were_not_recorded_or_whose_inputs_changed_while_it_ran_fails(stand_in) -> None:
    stand_in.unrecorded.add("tests/t/test_a.py")
    stand_in.edit_during["loop"] = "src/lib/judge.py"
    assert stand_in.main("--changed") == 1
    units = stand_in.data()["stages"]
    a = units["t"]["units"]["tests/t/test_a.py"]["result"]
    assert not a["passed"] and "its reads were not recorded" in a["failures"][0]
    loop = units["loop"]["units"]["loop"]["result"]
    assert not loop["passed"] and loop["failures"][0].startswith("its inputs changed while it ran: src/lib/judge.py")


def test_a_budget_runs_what_fits_and_the_next_call_picks_up_the_rest(stand_in, capsys) -> None:
    assert stand_in.main("--changed", "--budget-s", "150") == 3  # the test stage (never timed: 3 x 15 s + 30 s)
    assert [s for s, _ in stand_in.take()] == ["t", "t", "t"]
    assert "left for the next --changed call: 2 unit(s) of bench, loop" in capsys.readouterr().out
    assert stand_in.main("--changed", "--budget-s", "150") == 3 and stand_in.take() == [("bench", "bench")]
    assert stand_in.main("--changed") == 0 and stand_in.take() == [("loop", "loop")]


def test_a_call_limit_runs_what_fits_before_it_and_the_next_call_picks_up_the_rest(stand_in, gpu_stages,
                                                                                     capsys) -> None:
    call_s = str(150 + gpu_stages.HARVEST_S + 1)  # the test stage fits (75 s), the benchmark beside it not
    assert stand_in.main("--changed", "--call-s", call_s) == 3
    assert [s for s, _ in stand_in.take()] == ["t", "t", "t"]
    assert "left for the next --changed call: 2 unit(s) of bench, loop" in capsys.readouterr().out


def test_the_plan_packs_the_debt_into_device_calls_with_their_set_up(stand_in, gpu_check, capsys) -> None:
    assert stand_in.main("--changed") == 0
    stand_in.take()
    record = stand_in.data()
    long = gpu_check.stage_capacity(gpu_check.CALL_LIMIT_S) - 10.0
    for entry in record["stages"]["loop"]["units"].values():
        entry["result"]["seconds"] = long  # a long unit: a call of its own
    stand_in.record.write_text(json.dumps(record))
    (stand_in.root / "src" / "lib" / "core.py").write_text("X = 2\n")
    (stand_in.root / "src" / "lib" / "judge.py").write_text("J = 2\n")
    plan = tmp = stand_in.record.parent / "plan.json"
    assert stand_in.main("--plan", "--json", str(tmp)) == 0
    summary = json.loads(plan.read_text())
    assert summary["units"] == 5 and summary["stages"] == ["t", "bench", "loop"]
    assert [[p["stage"] for p in call["parts"]] for call in summary["calls"]] == [["t", "bench"], ["loop"]]
    assert all(call["seconds"] <= gpu_check.CALL_LIMIT_S for call in summary["calls"])
    assert summary["device_s"] == pytest.approx(sum(c["seconds"] for c in summary["calls"]) + gpu_check.MACHINE_START_S)
    out = capsys.readouterr().out
    assert "5 units of t, bench, loop to run on a GPU" in out and f"call 2, about {long + gpu_check.CALL_SETUP_S:.0f} s" in out


#: twenty empty commits as two shards of ten (the empty stage's own shards are smaller; the mechanism is the same)
SHARDS_OF_TEN = tuple((f"{start}-{start + 9}", ("--runs", "10", "--min-discards", "9")) for start in (1, 11))


def test_a_stage_longer_than_a_call_runs_in_shards_judged_together(stand_in, gpu_record, gpu_stages, capsys,
                                                                   monkeypatch) -> None:
    """Twenty empty commits outlast a device call: the stage runs as shards (here two of ten: a unit each, packed
    into calls of their own, each run with its own arguments), and its rule holds over the shards together: one
    run that is not 11 in each shard passes each shard, but 18 of 20 fails the stage."""
    soak = gpu_record.Stage("soak", "whole", ("loop.py",), "python loop.py", 400, "rule",
                            shards=SHARDS_OF_TEN, across_shards=gpu_stages.empty_across_shards)
    stand_in.stages.append(soak)
    stand_in.gpu_check.BY_NAME["soak"] = soak  # the stand-in's own table (monkeypatched, restored after the test)
    monkeypatch.setitem(READS, "soak", ["loop.py", "src/lib/judge.py"])
    assert soak.units(stand_in.root) == ["soak[1-10]", "soak[11-20]"]
    assert soak.shard_args("soak[11-20]") == ("--runs", "10", "--min-discards", "9")
    record = stand_in.record.parent / "record.json"
    record.write_text(json.dumps({"schema": gpu_record.SCHEMA, "stages": {"soak": {"units": {
        "soak[1-10]": {"result": {"seconds": 400.0}}, "soak[11-20]": {"result": {"seconds": 400.0}}}}}}))
    plan = stand_in.record.parent / "plan.json"
    assert stand_in.gpu_check.main(["--plan", "--stages", "soak", "--record", str(record), "--json", str(plan)]) == 0
    soak_calls = [[u for p in call["parts"] if p["stage"] == "soak" for u in p["units"]]
                  for call in json.loads(plan.read_text())["calls"]]
    assert [units for units in soak_calls if units] == [["soak[1-10]"], ["soak[11-20]"]]  # a call each

    def runs(discards: int) -> dict:
        return {"name": "empty commits judged 11 (of 10)", "value": discards, "limit": ">= 9", "runs": 10, "pass": True}

    stand_in.shard_targets = {"soak[1-10]": runs(9), "soak[11-20]": runs(10)}
    assert stand_in.main("--changed") == 0  # 19 of 20
    assert [u for u in stand_in.take() if u[0] == "soak"] == [("soak", "soak[1-10]"), ("soak", "soak[11-20]")]
    stand_in.shard_targets["soak[11-20]"] = runs(9)
    assert stand_in.main("--rerun", "soak=a second try") == 0 and stand_in.take() == []  # fresh: nothing is red
    (stand_in.root / "loop.py").write_text("print(3)\n")
    assert stand_in.main("--changed", "--stages", "soak") == 1  # each shard passed alone: 18 of 20 fails the stage
    assert stand_in.take() == [("soak", "soak[1-10]"), ("soak", "soak[11-20]")]
    capsys.readouterr()
    assert stand_in.main("--verify") == 1
    out = capsys.readouterr().out
    assert "red soak[1-10]: empty commits judged 11: 18 of 20 across the shards; at least 19 of 20 must be" in out
    stand_in.shard_targets["soak[11-20]"] = runs(10)
    assert stand_in.main("--rerun", "soak=the host was loaded") == 3  # both shards run again (loop.py's stage: debt)
    assert stand_in.take() == [("soak", "soak[1-10]"), ("soak", "soak[11-20]")]
    assert stand_in.main("--changed") == 0 and stand_in.take() == [("loop", "loop")]


def test_explain_prints_a_units_inputs_and_a_key_anyone_can_recompute(stand_in, capsys) -> None:
    assert stand_in.main("--changed") == 0
    capsys.readouterr()
    assert stand_in.main("--explain", "tests/t/test_b.py") == 0
    out = capsys.readouterr().out
    assert "t: tests/t/test_b.py: fresh" in out and "    kernels/k.cu" in out and "src/lib/judge.py" not in out
    data = stand_in.data()
    entry = data["stages"]["t"]["units"]["tests/t/test_b.py"]
    inputs = [data["paths"][i] for i in entry["inputs"]]
    sha = hashlib.sha256()
    for rel in sorted(inputs):
        sha.update(f"{len(rel)}:{rel}\0{hashlib.sha256((stand_in.root / rel).read_bytes()).hexdigest()}\n".encode())
    assert sha.hexdigest() == entry["inputs_sha256"]
    payload = {"inputs": entry["inputs_sha256"], "environment": entry["environment"], "definition": entry["definition"]}
    assert hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest() == entry["key"]
    assert stand_in.main("--explain", "tests/t/missing.py") == 2


def test_no_unit_runs_without_a_gpu(stand_in, capsys) -> None:
    stand_in.env = {"device": "cpu", "arch": "cpu"}
    assert stand_in.main("--changed") == 2 and stand_in.take() == [] and not stand_in.record.exists()
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_verify_and_plan_from_the_command_line_need_no_torch(tmp_path: Path) -> None:
    """Both run in an interpreter that cannot import torch; an old-format record is all debt (exit 3)."""
    blocker = tmp_path / "no_torch"
    blocker.mkdir()
    (blocker / "torch.py").write_text("raise ImportError('torch must not be imported')\n")
    record = tmp_path / "gpu_check.json"
    record.write_text(json.dumps({"schema": 2, "stages": {}}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(blocker), os.environ.get("PYTHONPATH")]))}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(SCRIPT), *args, "--record", str(record)], capture_output=True,
                              text=True, timeout=120, env=env, cwd=tmp_path)

    verified = run("--verify")
    assert verified.returncode == 3, verified.stdout + verified.stderr
    assert "not a schema-3 record" in verified.stdout
    planned = run("--plan")
    assert planned.returncode == 0 and "to run on a GPU" in planned.stdout, planned.stderr


# -- the stages' own rules ------------------------------------------------------------------------------

def test_corpus_shards_split_the_gpu_corpus_without_skips(pytester: pytest.Pytester, monkeypatch) -> None:
    """Every test of the GPU corpus is collected by exactly one shard (DITGATE_CORPUS_SHARD=i/n, as the corpus
    stage runs it): none is collected and then skipped in the others."""
    corpus = ROOT / "tests" / "gates" / "test_tolerance_corpus_gpu.py"
    ids = {}
    for shard in ("", "0/2", "1/2"):
        # the module reads its shard when imported: import it afresh in each run, whatever the outer
        # session imported already (the in-process run restores sys.modules afterwards)
        for name, module in list(sys.modules.items()):
            if getattr(module, "__file__", None) and Path(module.__file__).resolve() == corpus.resolve():
                monkeypatch.delitem(sys.modules, name)
        monkeypatch.setenv("DITGATE_CORPUS_SHARD", shard)
        items, _ = pytester.inline_genitems("-p", "no:cacheprovider", f"--rootdir={ROOT}", str(corpus))
        ids[shard] = [item.nodeid for item in items]
    assert ids[""] and sorted(ids["0/2"] + ids["1/2"]) == sorted(ids[""]) and ids["1/2"]
    assert any("test_tf32_tensor_cores" in i for i in ids["0/2"])


def test_the_environment_names_each_optional_package(gpu_check) -> None:
    found = gpu_check.optional_packages()
    assert set(found) == set(gpu_check.OPTIONAL_PACKAGES)
    assert all(version is None or isinstance(version, str) for version in found.values())
    assert gpu_check.packages_reached({"quack", "torch", "open_clip"}) == {"quack-kernels", "open-clip-torch"}
    assert gpu_check.packages_reached({"quack-kernels"}) == {"quack-kernels"}


def test_a_kernel_target_the_run_did_not_measure_is_missed_not_dropped(gpu_stages) -> None:
    """kernels_bench skips torch.compile when its time budget is spent; a bf16 case at the DiT shape then
    has no speed comparison, and that is a miss (a stage once passed with 14 of its 16 targets)."""
    def case(op, dtype, compiled):
        entry = {"op": op, "dtype": dtype, "bytes": 4e8, "kernels": {"median_ms": 0.1},
                 "check_kernels": {"passed": True}}
        if compiled:
            entry["compile"] = {"median_ms": 0.3}
        else:
            entry["compile_skipped"] = "time budget spent"
        return entry

    data = {"copy_bandwidth": {"TBps": 4.0}, "cases": {
        "gated_residual/bf16/64x4096x1152": case("gated_residual", "bf16", False),
        "layernorm_modulate/bf16/64x4096x1152": case("layernorm_modulate", "bf16", True),
        "layernorm_modulate/fp32/64x4096x1152": case("layernorm_modulate", "fp32", False)}}
    targets = {t["name"]: t for t in gpu_stages.kernels_targets(data)}
    missed = targets["gated_residual/bf16/64x4096x1152: speed vs torch.compile"]
    assert not missed["pass"] and "time budget spent" in missed["value"]
    assert targets["layernorm_modulate/bf16/64x4096x1152: speed vs torch.compile"]["pass"]
    assert "layernorm_modulate/fp32/64x4096x1152: speed vs torch.compile" not in targets


def test_a_unit_passes_only_when_its_tests_ran_none_failed_and_its_run_ended_normally(tmp_path: Path,
                                                                                      gpu_stages) -> None:
    xml = tmp_path / "r.xml"
    xml.write_text('<testsuites><testsuite><testcase file="tests/plugin/test_a.py" name="test_x" time="1.5"/>'
                   '<testcase file="tests/dit_impl/test_b.py" name="test_y"><skipped message="no GPU"/></testcase>'
                   '<testcase file="tests/plugin/test_c.py" name="test_z"><failure message="boom"/></testcase>'
                   "</testsuite></testsuites>")
    units = ["tests/plugin/test_a.py", "tests/dit_impl/test_b.py", "tests/plugin/test_c.py", "tests/plugin/test_d.py"]
    results = gpu_stages.unit_results(units, [1], [xml])
    assert results["tests/plugin/test_a.py"]["passed"] and results["tests/plugin/test_a.py"]["seconds"] == 1.5
    assert results["tests/dit_impl/test_b.py"]["passed"]  # skipped on this host, with its reason kept
    assert results["tests/dit_impl/test_b.py"]["skips"] == ["tests/dit_impl/test_b.py::test_y: no GPU"]
    assert not results["tests/plugin/test_c.py"]["passed"]
    assert results["tests/plugin/test_d.py"]["failures"] == ["no test of it ran"]
    crashed = gpu_stages.unit_results(units, [3], [xml])  # an internal error: nothing of that run holds
    assert not any(r["passed"] for r in crashed.values())
    missing = gpu_stages.unit_results(units[:1], [0], [tmp_path / "missing.xml"])
    assert not missing["tests/plugin/test_a.py"]["passed"]


def test_a_run_stopped_at_its_limit_judges_only_the_units_whose_tests_all_ran(tmp_path: Path, gpu_stages) -> None:
    """The plugin stage can outlast its limit on a new machine: its completed files keep their results, a file
    cut half-way has none (it stays in debt for the next call), and a cut run without a collection judges none."""
    xml = tmp_path / "r.xml"
    xml.write_text('<testsuites><testsuite><testcase file="tests/plugin/test_a.py" name="test_x" time="1.5"/>'
                   '<testcase file="tests/plugin/test_c.py" name="test_z"><failure message="boom"/></testcase>'
                   '<testcase file="tests/plugin/test_b.py" name="test_y1" time="2"/>'
                   "</testsuite></testsuites>")
    units = ["tests/plugin/test_a.py", "tests/plugin/test_b.py", "tests/plugin/test_c.py", "tests/plugin/test_d.py"]
    collected = {"tests/plugin/test_a.py": 1, "tests/plugin/test_b.py": 2, "tests/plugin/test_c.py": 1,
                 "tests/plugin/test_d.py": 3}
    results = gpu_stages.unit_results(units, [124], [xml], collected)
    assert set(results) == {"tests/plugin/test_a.py", "tests/plugin/test_c.py"}  # b ran 1 of 2 tests, d none
    assert results["tests/plugin/test_a.py"]["passed"] and results["tests/plugin/test_a.py"]["failures"] == []
    assert not results["tests/plugin/test_c.py"]["passed"]  # a failure that happened before the stop still counts
    assert gpu_stages.unit_results(units, [124], [xml]) == {}
    assert set(gpu_stages.unit_results(units, [1], [xml], collected)) == set(units)  # not stopped: all judged


def test_a_test_stage_on_several_workers_is_planned_by_its_longest_test_not_its_longest_file(
        tmp_path: Path, gpu_check, gpu_record, gpu_stages) -> None:
    """xdist shares a file's tests out among the plugin stage's workers: a file of seventeen 25-s tests (425 s)
    does not hold the stage for 425 s on twelve workers. A unit's result keeps its longest test, and the plan
    takes that as the floor of a part on several workers; one worker runs its files' tests one after another."""
    xml = tmp_path / "r.xml"
    cases = "".join(f'<testcase file="tests/plugin/test_judge.py" name="test_{i}" time="25"/>' for i in range(17))
    xml.write_text(f'<testsuites><testsuite>{cases}'
                   '<testcase file="tests/plugin/test_quick.py" name="test_q" time="2"/></testsuite></testsuites>')
    units = ["tests/plugin/test_judge.py", "tests/plugin/test_quick.py"]
    results = gpu_stages.unit_results(units, [0], [xml])
    assert results[units[0]]["seconds"] == 425 and results[units[0]]["longest_s"] == 25
    plugin = gpu_check.BY_NAME["plugin"]
    states = [gpu_record.UnitState(plugin, unit, "debt", seconds=results[unit]["seconds"],
                                   entry={"result": results[unit]}) for unit in units]
    extra = gpu_check.overhead({}, plugin, 2)
    assert gpu_check.estimate({}, plugin, states) == pytest.approx(extra + 427 / 2)  # two workers share them
    many = states + [gpu_record.UnitState(plugin, f"tests/plugin/test_{i}.py", "debt", seconds=1.0,
                                          entry={"result": {"seconds": 1.0, "longest_s": 1.0}}) for i in range(20)]
    assert gpu_check.estimate({}, plugin, many) == pytest.approx(gpu_check.overhead({}, plugin, 22) + 447 / 12)
    # a result from before the longest test was kept: the file's whole time stays the floor
    old = [gpu_record.UnitState(plugin, units[0], "debt", seconds=425.0, entry={"result": {"seconds": 425.0}})]
    assert gpu_check.estimate({}, plugin, old) == pytest.approx(gpu_check.overhead({}, plugin, 1) + 425)


def test_a_unit_left_without_a_result_stays_in_debt(stand_in) -> None:
    real = stand_in.run_tests

    def stopped(stage, units, logs, recorded):
        results, seconds = real(stage, units, logs, recorded)
        results.pop("tests/t/test_b.py")
        return results, seconds

    stand_in.run_tests = stopped
    stand_in.gpu_check.gpu_stages.run_tests = stopped
    assert stand_in.main("--changed") == 3
    assert "tests/t/test_b.py" not in stand_in.data()["stages"]["t"]["units"]
    stand_in.take()
    stand_in.gpu_check.gpu_stages.run_tests = real
    assert stand_in.main("--changed") == 0 and stand_in.take() == [("t", "tests/t/test_b.py")]


def test_a_test_stage_that_does_not_fit_beside_earlier_stages_starts_a_call(gpu_check, gpu_record, monkeypatch) -> None:
    """The plan never packs a call past its limit: a test stage's first file that does not fit beside the
    stages already in the call opens the next call (the corpus once made a 641 s call)."""
    first = gpu_record.Stage("first", "tests", ("tests",), "pytest", 300, "rule", workers=1)
    second = gpu_record.Stage("second", "tests", ("tests",), "pytest", 300, "rule", workers=1)
    monkeypatch.setattr(gpu_check, "STAGES", [first, second])
    todo = [gpu_record.UnitState(first, "tests/a/test_1.py", "debt", seconds=300.0),
            gpu_record.UnitState(second, "tests/b/test_2.py", "debt", seconds=150.0)]
    calls = gpu_check.pack({}, todo, 400.0)
    assert [[(p.stage.name, [u.unit for u in p.units]) for p in call] for call in calls] == [
        [("first", ["tests/a/test_1.py"])], [("second", ["tests/b/test_2.py"])]]
    assert all(sum(p.seconds for p in call) <= 400.0 for call in calls)


def test_a_stages_test_files_reach_pytest_with_each_directory_adjacent(gpu_stages, tmp_path: Path) -> None:
    # the plan orders units by cost; pytest 9.1 (the GPU machine's) loses a nested conftest's fixtures for a file
    # given after another directory's file, so the command line keeps every directory's files together
    planned = ["tests/gates/dit/test_shapes.py", "tests/dit_fast/test_lane_classes.py",
               "tests/gates/test_bench_gpu.py", "tests/gates/dit/test_tiny_baseline.py", "tests/gates/x/test_a.py"]
    command = gpu_stages.pytest_command(tmp_path / "run.xml", 20, planned, "-n", "4")
    paths = command[command.index("4") + 1:]
    assert sorted(paths) == sorted(planned) and command[-len(planned) - 2:-len(planned)] == ["-n", "4"]
    for directory in {str(Path(path).parent) for path in planned}:
        inside = [index for index, path in enumerate(paths) if path.startswith(directory + "/")]
        assert inside == list(range(inside[0], inside[-1] + 1)), (directory, paths)


def test_a_call_stopped_mid_stage_keeps_what_finished_and_writes_its_record(stand_in, tmp_path: Path, capsys,
                                                                            monkeypatch) -> None:
    # the device call's limit sends SIGINT while a stage runs (the attacks stage on an H100): the stages that
    # finished are in the record that comes back, the interrupted one stays debt, and the table is printed
    run_whole = stand_in.run_whole

    def interrupted(stage, unit, *args):
        if stage.name == "loop":
            raise KeyboardInterrupt
        return run_whole(stage, unit, *args)

    monkeypatch.setattr(stand_in.gpu_check.gpu_stages, "run_whole", interrupted)
    out = tmp_path / "out" / "gpu_check.json"
    assert stand_in.main("--changed", "--json", str(out)) == 3
    text = capsys.readouterr().out
    assert "stopped while loop ran" in text and "GREEN: False (debt)" in text
    recorded = json.loads(out.read_text())
    verdict = stand_in.gpu_check.gpu_record.states(recorded, stand_in.stages, stand_in.root, stand_in.env)
    assert {s.unit: s.status for s in verdict} == {"tests/t/test_a.py": "fresh", "tests/t/test_b.py": "fresh",
                                                   "tests/t/test_q.py": "fresh", "bench": "fresh", "loop": "debt"}


def test_what_a_device_call_brings_back_names_no_machine_path(tmp_path: Path) -> None:
    # logs and results are committed as they come back: the repository root, the call's output folder and the
    # home folder are written <repo>, $OUT and ~; the recordings keep theirs (the GPU check reads them)
    root = Path(__file__).resolve().parents[2]
    out, home = tmp_path / "out", tmp_path / "home"
    logs = out / "logs"
    logs.mkdir(parents=True)
    text = f"{root}/tests/gates/test_x.py failed; wrote {out}/results/r.json; looked in {home}/.cache/torch\n"
    for name in ("run.log", "table.txt", "bench.json", "record.jsonl"):
        (logs / name).write_text(text)
    env = dict(os.environ, OUT=str(out), HOME=str(home))
    subprocess.run(["bash", str(root / "scripts" / "scrub_paths.sh"), str(logs), str(out / "absent")], env=env,
                   check=True)
    scrubbed = "<repo>/tests/gates/test_x.py failed; wrote $OUT/results/r.json; looked in ~/.cache/torch\n"
    assert [(logs / n).read_text() for n in ("run.log", "table.txt", "bench.json")] == [scrubbed] * 3
    assert (logs / "record.jsonl").read_text() == text


def test_a_stage_started_near_the_calls_limit_stops_itself_and_keeps_what_finished(gpu_stages, monkeypatch) -> None:
    """The device call stops the check at --call-s. A stage whose own limit reaches past that gets only the time
    left, less the harvest, so that pytest stops itself and its finished files are recorded (an H100 call
    stopped the plugin stage at 498 s of its 520 and recorded none of the 83 files that had finished)."""
    import time

    monkeypatch.setattr(gpu_stages, "CALL_DEADLINE", time.monotonic() + 100)
    limit, cut = gpu_stages.time_for(300)
    assert cut and 100 - gpu_stages.HARVEST_S - 2 < limit <= 100 - gpu_stages.HARVEST_S
    assert gpu_stages.time_for(20) == (20, False)
    given = []
    monkeypatch.setitem(gpu_stages.TEST_RUNNERS, "plugin",
                        lambda units, logs, limit, recorded: (given.append(limit) or {}, 0.0))
    stage = next(s for s in gpu_stages.STAGES if s.name == "plugin")
    gpu_stages.run_tests(stage, ["tests/plugin/test_report.py"], Path("."), None)
    assert given and given[0] <= 100 - gpu_stages.HARVEST_S
    monkeypatch.setattr(gpu_stages, "CALL_DEADLINE", None)
    gpu_stages.run_tests(stage, ["tests/plugin/test_report.py"], Path("."), None)
    assert given[1] == stage.limit_s


def test_a_whole_unit_stopped_by_the_calls_limit_is_stopped_not_failed(gpu_stages, gpu_record, monkeypatch) -> None:
    """A benchmark or loop shard cut by the call's limit has not failed: it has no result yet. One cut by its own
    limit has failed."""
    import time

    def cut(stage, unit, arch, logs, out, recorded, limit):
        return {"rc": 124, "seconds": limit, "targets": [], "failures": ["exited 124"], "passed": False}

    monkeypatch.setattr(gpu_stages, "_run_whole", cut)
    loop = gpu_record.Stage("loop", "whole", ("loop.py",), "python loop.py", 200, "rule")
    monkeypatch.setattr(gpu_stages, "CALL_DEADLINE", time.monotonic() + 100)
    assert gpu_stages.run_whole(loop, "loop", "sm_90", Path("."), Path("."), None)["stopped"] == "the device call's limit"
    monkeypatch.setattr(gpu_stages, "CALL_DEADLINE", None)
    assert "stopped" not in gpu_stages.run_whole(loop, "loop", "sm_90", Path("."), Path("."), None)


def test_a_whole_unit_stopped_by_the_calls_limit_stays_in_debt_not_red(stand_in, gpu_stages, monkeypatch) -> None:
    real = stand_in.run_whole

    def loop_cut(stage, unit, *args):
        result = real(stage, unit, *args)
        return dict(result, rc=124, passed=False, stopped="the device call's limit") if unit == "loop" else result

    monkeypatch.setattr(gpu_stages, "run_whole", loop_cut)
    assert stand_in.main("--changed") == 3
    states = {s.unit: s.status for s in stand_in.gpu_check.gpu_record.states(stand_in.data(), stand_in.stages,
                                                                                stand_in.root, stand_in.env)}
    assert states["loop"] == "debt" and states["bench"] == "fresh"


def test_no_stage_starts_with_too_little_of_the_call_left(stand_in, capsys) -> None:
    assert stand_in.main("--changed", "--call-s", "50") == 3  # 50 s less the harvest: under MIN_STAGE_S
    assert stand_in.take() == []
    assert "not started, too little of the call is left" in capsys.readouterr().out
    assert stand_in.gpu_check.gpu_stages.CALL_DEADLINE is not None
    assert stand_in.main("--changed") == 0  # no --call-s: no deadline
    assert stand_in.gpu_check.gpu_stages.CALL_DEADLINE is None


def test_a_unit_recorded_only_at_its_end_starts_only_with_its_time_left(gpu_check, gpu_record, gpu_stages,
                                                                         monkeypatch, capsys, tmp_path: Path) -> None:
    """The corpus is one file in shards, recorded only when all of them end: started with 85 s of a call left
    for about 97 s of work (as on an H100), it was stopped with nothing recorded. A unit recorded at its end
    starts only with its estimated time left; a test stage of many files starts with less (each file that ends
    is recorded)."""
    import time

    ran = []
    monkeypatch.setattr(gpu_stages, "run_tests", lambda stage, units, logs, recorded: (ran.append(list(units)) or {}, 0.0))
    corpus = gpu_record.Stage("corpus", "tests", ("tests/gates/test_tolerance_corpus_gpu.py",), "pytest", 300, "rule")
    monkeypatch.setattr(gpu_stages, "CALL_DEADLINE", time.monotonic() + gpu_stages.HARVEST_S + 85)
    one = ["tests/gates/test_tolerance_corpus_gpu.py"]
    done = gpu_check.run_units(corpus, one, "sm_90", tmp_path / "logs", tmp_path / "out", estimates={one[0]: 97.0})
    assert ran == [] and done.results == {}
    assert "not started, too little of the call is left (85 s for about 97 s)" in capsys.readouterr().out
    gpu_check.run_units(corpus, one, "sm_90", tmp_path / "logs", tmp_path / "out", estimates={one[0]: 60.0})
    many = ["tests/a.py", "tests/b.py"]
    gpu_check.run_units(corpus, many, "sm_90", tmp_path / "logs", tmp_path / "out",
                        estimates={"tests/a.py": 97.0, "tests/b.py": 97.0})
    assert ran == [one, many]
    monkeypatch.setattr(gpu_stages, "CALL_DEADLINE", None)


def test_a_shard_is_not_started_once_too_little_of_the_call_is_left(gpu_check, gpu_record, gpu_stages, monkeypatch,
                                                                   tmp_path: Path) -> None:
    import time

    soak = gpu_record.Stage("soak", "whole", ("loop.py",), "python loop.py", 400, "rule",
                            shards=SHARDS_OF_TEN, across_shards=gpu_stages.empty_across_shards)
    ran = []

    def first_shard_uses_the_call(stage, unit, *args):
        ran.append(unit)
        gpu_stages.CALL_DEADLINE = time.monotonic() + gpu_stages.HARVEST_S + 5  # 5 s left after it
        return {"passed": True, "seconds": 300.0}

    monkeypatch.setattr(gpu_stages, "CALL_DEADLINE", None)
    monkeypatch.setattr(gpu_stages, "run_whole", first_shard_uses_the_call)
    done = gpu_check.run_units(soak, soak.units(tmp_path), "sm_90", tmp_path / "logs", tmp_path / "out")
    assert ran == ["soak[1-10]"] and list(done.results) == ["soak[1-10]"]  # the second stays in debt
