"""scripts/gpu_check.py on a CPU: what each stage reads, the keys that tie a result to a tree, --verify,
--plan, and how --changed and --stages run and merge stages (with a stand-in device and stand-in stages)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.py"
ENV = {"device": "NVIDIA H200", "arch": "sm_90", "torch": "2.11.0", "driver": "580", "packages": {"diffusers": "0.42.1"}}


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gpu_record(gpu_check):
    return sys.modules["gpu_record"]


@pytest.fixture
def shaped_tree(tmp_path: Path, gpu_check, gpu_record) -> Path:
    """A tree with this repository's shape: every file any stage reads or the tree hash covers, each holding
    its own path (small, and a stand-in for the real bytes)."""
    every = set(gpu_record.hashed_files(ROOT))
    for stage in gpu_check.STAGES:
        every.update(gpu_record.expand(stage.all_inputs(), ROOT))
    for path in every:
        rel = path.relative_to(ROOT)
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(f"{rel.as_posix()}\n")
    return tmp_path


def _passed(seconds: float = 10.0) -> dict:
    return {"passed": True, "seconds": seconds, "failures": []}


def _record_all(gpu_check, gpu_record, root: Path, env: dict = ENV, result=_passed) -> dict:
    record: dict = {}
    for stage in gpu_check.STAGES:
        record = gpu_record.merge(record, stage, gpu_record.state_of(stage, root), env, result(), "2026-12-04T00:00:00Z")
    return record


def _stale(gpu_check, gpu_record, record: dict, root: Path) -> dict[str, str]:
    entries = record["stages"]
    states = {s.name: gpu_record.stage_status(entries.get(s.name), s, gpu_record.state_of(s, root))
              for s in gpu_check.STAGES}
    return {name: why for name, (status, why) in states.items() if status != "fresh"}


# -- what the stages read ------------------------------------------------------------------------------

def test_every_hashed_file_of_this_repository_is_read_by_some_stage(gpu_check, gpu_record) -> None:
    """A hashed file no stage reads could change without making any result stale; and every stage reads the
    plugin and the project's configuration."""
    assert gpu_record.uncovered(gpu_check.STAGES, ROOT) == []
    for stage in gpu_check.STAGES:
        assert {"src/**", "conftest.py", "pyproject.toml"} <= set(stage.all_inputs()), stage.name


def test_an_unread_hashed_file_is_named(tmp_path: Path, gpu_record) -> None:
    for rel in ("src/pkg/mod.py", "kernels/a.cu", "tests/x/test_a.py", "docs/a.md", "conftest.py", "pyproject.toml"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    stage = gpu_record.Stage("a", ("kernels/**",), "a", 10)
    assert stage.all_inputs() == ["src/**", "conftest.py", "pyproject.toml", "kernels/**"]
    assert gpu_record.uncovered([stage], tmp_path) == ["tests/x/test_a.py is an input of no stage"]
    assert gpu_record.uncovered([stage, gpu_record.Stage("b", ("tests/x/*.py",), "b", 10)], tmp_path) == []


@pytest.mark.parametrize(("changed", "stale"), [
    ("kernels/adaln.py", {"suites", "kernels", "dit", "loop", "plugin"}),
    ("benchmarks/timer_fidelity.py", {"fidelity", "plugin"}),
    ("benchmarks/kernels_bench.py", {"kernels", "plugin"}),
    ("tests/plugin/test_report.py", {"plugin"}),
    ("tests/gates/test_bench_gpu.py", {"suites", "plugin"}),
    ("tests/plugin/test_tolerance_corpus.py", {"corpus", "plugin"}),
    ("scripts/agent_loop_check.py", {"loop", "plugin"}),
    ("src/pytest_ditgate/plugin.py", {"suites", "corpus", "fidelity", "kernels", "dit", "loop", "plugin"}),
    ("README.md", set()),
])
def test_a_change_makes_stale_exactly_the_stages_that_read_it(shaped_tree: Path, gpu_check, gpu_record, changed,
                                                               stale) -> None:
    record = _record_all(gpu_check, gpu_record, shaped_tree)
    assert _stale(gpu_check, gpu_record, record, shaped_tree) == {}
    (shaped_tree / changed).write_text("edited\n")
    found = _stale(gpu_check, gpu_record, record, shaped_tree)
    assert set(found) == stale
    assert all(why == f"edited {changed}" for why in found.values()), found


# -- keys ------------------------------------------------------------------------------------------------

def test_a_key_is_recomputable_from_the_record_alone(shaped_tree: Path, gpu_check, gpu_record) -> None:
    """The record's recipe (key_scheme), each stage's inputs, runs, judged_by and environment give its key."""
    import hashlib

    entry = _record_all(gpu_check, gpu_record, shaped_tree)["stages"]["dit"]
    files = gpu_record.expand(entry["inputs"], shaped_tree)
    files_sha = gpu_record.digest(files, shaped_tree)
    assert files_sha == entry["files_sha256"]
    payload = {"files": files_sha, "environment": entry["environment"],
               "stage": {"inputs": entry["inputs"], "runs": entry["runs"], "judged_by": entry["judged_by"]}}
    assert hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest() == entry["key"]


def test_another_environment_or_a_changed_definition_makes_a_stage_stale(shaped_tree: Path, gpu_check,
                                                                            gpu_record) -> None:
    stage = gpu_check.BY_NAME["fidelity"]
    state = gpu_record.state_of(stage, shaped_tree)
    entry = gpu_record.merge({}, stage, state, ENV, _passed(), "t")["stages"]["fidelity"]
    assert gpu_record.stage_status(entry, stage, state) == ("fresh", "")
    other = {**ENV, "packages": {"diffusers": None}}
    assert gpu_record.stage_status(entry, stage, state, other) == ("stale", "environment differs (packages)")
    stricter = gpu_record.Stage(stage.name, stage.inputs, stage.runs + " --runs 5", stage.limit_s, stage.judged_by)
    assert gpu_record.stage_status(entry, stricter, state)[0] == "stale"
    ruled = gpu_record.Stage(stage.name, stage.inputs, stage.runs, stage.limit_s, stage.judged_by + "# stricter\n")
    assert "the rule that judges it" in gpu_record.stage_status(entry, ruled, state)[1]


def test_the_tree_hash_covers_sources_and_skips_caches(tmp_path: Path, gpu_check) -> None:
    (tmp_path / "src" / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "mod.py").write_text("x = 1\n")
    (tmp_path / "README.md").write_text("docs are not hashed\n")
    before = gpu_check.tree_hash(tmp_path)
    (tmp_path / "src" / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "src" / "pkg" / "x.lock").write_text("")
    (tmp_path / "README.md").write_text("changed\n")
    assert gpu_check.tree_hash(tmp_path) == before
    (tmp_path / "src" / "pkg" / "mod.py").write_text("x = 2\n")
    assert gpu_check.tree_hash(tmp_path) != before


# -- verify ----------------------------------------------------------------------------------------------

def test_verify_is_green_only_when_every_stage_is_fresh_and_passed(shaped_tree: Path, gpu_check, gpu_record) -> None:
    record = _record_all(gpu_check, gpu_record, shaped_tree)
    ok, lines = gpu_record.verify(record, gpu_check.STAGES, shaped_tree)
    assert ok and all(line.startswith("fresh") for line in lines), lines
    red = json.loads(json.dumps(record))
    red["stages"]["corpus"]["result"] = {"passed": False, "seconds": 9.0, "failures": ["t.py::x: boom", "t.py::y"]}
    ok, lines = gpu_record.verify(red, gpu_check.STAGES, shaped_tree)
    assert not ok and any(line.startswith("red   corpus") and "t.py::x: boom (+1 more)" in line for line in lines)
    mixed = _record_all(gpu_check, gpu_record, shaped_tree)
    stage = gpu_check.BY_NAME["dit"]
    mixed = gpu_record.merge(mixed, stage, gpu_record.state_of(stage, shaped_tree), {**ENV, "torch": "2.12.0"},
                             _passed(), "t")
    ok, lines = gpu_record.verify(mixed, gpu_check.STAGES, shaped_tree)
    assert not ok and any("different environments" in line for line in lines), lines
    (shaped_tree / "kernels" / "new_kernel.cu").write_text("//\n")
    ok, lines = gpu_record.verify(record, gpu_check.STAGES, shaped_tree)
    assert not ok and any(line.startswith("stale kernels") and "added kernels/new_kernel.cu" in line for line in lines)
    assert not gpu_record.verify({"tree_hash": "x", "green": True}, gpu_check.STAGES, shaped_tree)[0]


def test_verify_and_plan_from_the_command_line_need_no_torch(tmp_path: Path, gpu_check, gpu_record) -> None:
    """--verify exits 0 only for a record of this very tree; --plan lists what a landing must run, with times.
    Both run in an interpreter that cannot import torch."""
    record = _record_all(gpu_check, gpu_record, ROOT, result=lambda: _passed(42.0))
    path = tmp_path / "gpu_check.json"
    path.write_text(json.dumps(record))
    blocker = tmp_path / "no_torch"
    blocker.mkdir()
    (blocker / "torch.py").write_text("raise ImportError('torch must not be imported')\n")
    env = {**os.environ, "PYTHONPATH": str(blocker)}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(SCRIPT), *args, "--record", str(path)], capture_output=True,
                              text=True, timeout=120, env=env, cwd=tmp_path)

    verified = run("--verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "the record covers this tree" in verified.stdout
    assert run("--plan").stdout.startswith("0 of 7 stages to run on a GPU, about 0 s")
    record["stages"]["loop"]["key"] = "0" * 64
    path.write_text(json.dumps(record))
    stale = run("--verify")
    assert stale.returncode == 1 and "stale loop" in stale.stdout
    assert "1 of 7 stages to run on a GPU, about 42 s" in run("--plan").stdout


# -- running stages (a stand-in device) ---------------------------------------------------------------------

@pytest.fixture
def stand_in(tmp_path: Path, gpu_check, gpu_record, monkeypatch):
    """Three small stages over a tiny tree, an H200 environment, and runners that record what ran."""
    root = tmp_path / "tree"
    for rel in ("src/p.py", "conftest.py", "pyproject.toml", "kernels/k.cu", "tests/t.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    stages = [gpu_record.Stage("a", ("kernels/**",), "a", 100), gpu_record.Stage("b", ("tests/**",), "b", 100),
              gpu_record.Stage("c", ("kernels/**",), "c", 100)]
    ran: list[str] = []
    outcomes: dict[str, dict] = {}

    def runner(name, arch, logs, out):
        def run():
            ran.append(name)
            return outcomes.get(name, _passed(30.0))
        return run

    monkeypatch.setattr(gpu_check, "ROOT", root)
    monkeypatch.setattr(gpu_check, "STAGES", stages)
    monkeypatch.setattr(gpu_check, "BY_NAME", {s.name: s for s in stages})
    monkeypatch.setattr(gpu_check, "environment", lambda: dict(ENV))
    monkeypatch.setattr(gpu_check, "runner", runner)
    record = tmp_path / "gpu_check.json"

    def main(*args: str) -> int:
        return gpu_check.main([*args, "--record", str(record), "--logs", str(tmp_path / "logs")])

    return root, record, ran, outcomes, main


def test_changed_runs_only_the_stale_stages_and_merges_them(stand_in, capsys) -> None:
    root, record, ran, _, main = stand_in
    assert main("--changed") == 0 and ran == ["a", "b", "c"]
    assert main("--changed") == 0 and ran == ["a", "b", "c"]  # nothing stale: nothing runs
    (root / "tests" / "t.py").write_text("edited")
    assert main("--verify") == 1 and "stale b" in capsys.readouterr().out
    assert main("--changed") == 0 and ran == ["a", "b", "c", "b"]
    data = json.loads(record.read_text())
    assert data["schema"] == 2 and set(data["stages"]) == {"a", "b", "c"} and "key_scheme" in data
    assert main("--verify") == 0


def test_a_budget_leaves_what_does_not_fit_for_the_next_call(stand_in, capsys) -> None:
    root, record, ran, _, main = stand_in
    assert main("--changed", "--budget-s", "250") == 1 and ran == ["a", "b"]  # 100 s each until one ran
    assert "left for the next --changed call: c" in capsys.readouterr().out
    assert main("--changed", "--budget-s", "250") == 0 and ran == ["a", "b", "c"]
    (root / "kernels" / "k.cu").write_text("edited")
    assert main("--changed", "--budget-s", "40") == 1 and ran == ["a", "b", "c", "a"]  # measured 30 s each now


def test_a_red_stage_runs_again_only_with_its_reason_and_the_failure_stays(stand_in, capsys) -> None:
    root, record, ran, outcomes, main = stand_in
    outcomes["b"] = {"passed": False, "seconds": 5.0, "failures": ["t.py::x: flaky?"]}
    assert main("--changed") == 1 and ran == ["a", "b", "c"]
    assert main("--changed") == 1 and ran == ["a", "b", "c"]
    assert "red, not run again (name them with --rerun STAGE=WHY): b" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        main("--stages", "b")
    assert refused.value.code == 2 and "--rerun STAGE=WHY" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main("--rerun", "b")  # no reason
    outcomes.pop("b")
    assert main("--rerun", "b=the host was loaded by another job") == 0 and ran[-1] == "b"
    entry = json.loads(record.read_text())["stages"]["b"]
    assert entry["result"]["passed"] and entry["superseded"][0]["reason"] == "the host was loaded by another job"
    assert entry["superseded"][0]["result"]["failures"] == ["t.py::x: flaky?"]
    (root / "tests" / "t.py").write_text("fixed")
    assert main("--changed") == 0
    assert "superseded" not in json.loads(record.read_text())["stages"]["b"]  # a new key starts afresh


def test_a_stage_whose_inputs_change_while_it_runs_fails(stand_in, gpu_check, monkeypatch) -> None:
    root, record, ran, _, main = stand_in

    def edit_during_the_run(name, arch, logs, out):
        def run():
            ran.append(name)
            (root / "kernels" / "k.cu").write_text(f"edited during {name}")
            return {"passed": True, "seconds": 1.0, "failures": []}
        return run

    monkeypatch.setattr(gpu_check, "runner", edit_during_the_run)
    assert main("--stages", "a") == 1
    result = json.loads(record.read_text())["stages"]["a"]["result"]
    assert not result["passed"] and result["failures"][0] == "its inputs changed while it ran"


def test_no_stage_runs_without_a_gpu(stand_in, monkeypatch, gpu_check, capsys) -> None:
    _, record, ran, _, main = stand_in
    monkeypatch.setattr(gpu_check, "environment", lambda: {"device": "cpu", "arch": "cpu"})
    assert main("--changed") == 2 and ran == [] and not record.exists()
    assert "needs a CUDA GPU" in capsys.readouterr().err


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


def test_a_kernel_target_the_run_did_not_measure_is_missed_not_dropped(gpu_check) -> None:
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
    targets = {t["name"]: t for t in gpu_check.kernels_targets(data)}
    missed = targets["gated_residual/bf16/64x4096x1152: speed vs torch.compile"]
    assert not missed["pass"] and "time budget spent" in missed["value"]
    assert targets["layernorm_modulate/bf16/64x4096x1152: speed vs torch.compile"]["pass"]
    assert "layernorm_modulate/fp32/64x4096x1152: speed vs torch.compile" not in targets


def test_a_tests_stage_passes_only_when_every_run_exited_0_and_something_passed(tmp_path: Path, gpu_check) -> None:
    xml = tmp_path / "r.xml"
    xml.write_text('<testsuites><testsuite><testcase file="tests/plugin/test_a.py" name="test_x"/>'
                   '<testcase file="tests/dit_impl/test_b.py" name="test_y"><skipped message="no GPU"/></testcase>'
                   "</testsuite></testsuites>")
    suites = gpu_check.PLUGIN_TESTS
    result = gpu_check.tests_result([0], [xml], suites, 3.0)
    assert result["passed"] and result["counts"]["plugin"]["passed"] == 1 and result["counts"]["dit_impl"]["skipped"] == 1
    assert not gpu_check.tests_result([1], [xml], suites, 3.0)["passed"]
    assert not gpu_check.tests_result([0], [tmp_path / "missing.xml"], suites, 3.0)["passed"]
