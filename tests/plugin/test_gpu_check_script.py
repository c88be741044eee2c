"""scripts/gpu_check.py on a CPU: the tree hash (what it covers) and merging checks that ran other stages."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _record(stages: tuple[str, ...], tree: str = "t1", passed: bool = True, **extra) -> dict:
    return {"tree_hash": tree, "tree_hash_after": tree, "environment": {"device": "H200", "arch": "sm_90"},
            "started": "2026-12-01T04:00:00Z", "seconds": 100.0,
            "stages": {s: {"passed": passed, "seconds": 10.0} for s in stages}, **extra}


def test_checks_that_together_ran_every_stage_merge_green(gpu_check) -> None:
    stages = list(gpu_check.STAGE_LIMITS)
    merged = gpu_check.merge_records([_record(tuple(stages[3:])), _record(tuple(stages[:3]))])
    assert merged["green"] and merged["stages_run"] == stages and merged["seconds"] == 200.0
    assert [c["stages"] for c in merged["calls"]] == [stages[3:], stages[:3]]


@pytest.mark.parametrize(("second", "problem"), [
    (dict(tree="t2"), "tree hashes differ: t1 and t2"),
    (dict(passed=False), None),
    (dict(partial=True), "a check did not finish"),
    (dict(tree_hash_after="t9"), "the tree changed while a check ran"),
])
def test_a_merge_is_not_green_when_the_checks_do_not_belong_together(gpu_check, second: dict, problem) -> None:
    stages = list(gpu_check.STAGE_LIMITS)
    merged = gpu_check.merge_records([_record(tuple(stages[:3])), _record(tuple(stages[3:]), **second)])
    assert not merged["green"]
    if problem:
        assert any(problem in p for p in merged["problems"]), merged["problems"]


def test_checks_with_other_optional_packages_do_not_merge(gpu_check) -> None:
    """A stage run without quack (its gemm=quack tests skipped) must not stand in for one run with it."""
    stages = list(gpu_check.STAGE_LIMITS)
    with_quack = _record(tuple(stages[:3]))
    without = _record(tuple(stages[3:]))
    with_quack["environment"] = {**with_quack["environment"], "packages": {"quack-kernels": "0.6.5"}}
    without["environment"] = {**without["environment"], "packages": {"quack-kernels": None}}
    merged = gpu_check.merge_records([with_quack, without])
    assert not merged["green"] and any("different devices or software" in p for p in merged["problems"]), merged["problems"]


def test_the_environment_names_each_optional_package(gpu_check) -> None:
    found = gpu_check.optional_packages()
    assert set(found) == set(gpu_check.OPTIONAL_PACKAGES)
    assert all(version is None or isinstance(version, str) for version in found.values())


def test_a_merge_missing_a_stage_or_repeating_one_is_not_green(gpu_check) -> None:
    stages = list(gpu_check.STAGE_LIMITS)
    assert "no check ran: " + stages[-1] in gpu_check.merge_records([_record(tuple(stages[:-1]))])["problems"]
    twice = gpu_check.merge_records([_record(tuple(stages)), _record((stages[0],))])
    assert f"stage {stages[0]} ran in more than one check" in twice["problems"] and not twice["green"]


def test_merge_from_the_command_line_writes_the_record(tmp_path: Path, gpu_check) -> None:
    stages = list(gpu_check.STAGE_LIMITS)
    paths = []
    for i, part in enumerate((stages[:2], stages[2:])):
        paths.append(tmp_path / f"{i}.json")
        paths[-1].write_text(json.dumps(_record(tuple(part))))
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--merge", *map(str, paths), "--json", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(out.read_text())["green"] is True and "GREEN: True" in proc.stdout


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


def test_corpus_shards_split_the_gpu_corpus_without_skips() -> None:
    """Every test of the GPU corpus is collected by exactly one shard (DITGATE_CORPUS_SHARD=i/n, as the corpus
    stage runs it): none is collected and then skipped in the others."""
    import os

    corpus = ROOT / "tests" / "gates" / "test_tolerance_corpus_gpu.py"

    def collect(shard: str) -> subprocess.Popen:
        env = {**os.environ, "DITGATE_CORPUS_SHARD": shard}
        return subprocess.Popen([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", str(corpus)],
                                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    runs = {shard: collect(shard) for shard in ("", "0/2", "1/2")}
    ids = {}
    for shard, run in runs.items():
        out = run.communicate(timeout=120)[0]
        assert run.returncode == 0, out
        ids[shard] = [line for line in out.splitlines() if "::" in line]
    assert sorted(ids["0/2"] + ids["1/2"]) == sorted(ids[""]) and ids["1/2"]
    assert any("test_tf32_tensor_cores" in i for i in ids["0/2"])


def test_a_stage_run_again_with_its_reason_counts_its_last_result_and_keeps_the_first(gpu_check) -> None:
    """A failed stage may run again only when named with why; the failure stays in the record."""
    stages = list(gpu_check.STAGE_LIMITS)
    first = _record(tuple(stages))
    first["stages"]["fidelity"] = {"passed": False, "seconds": 10.0, "failures": ["target missed: x"]}
    again = _record(("fidelity",))
    assert not gpu_check.merge_records([first, again])["green"]
    merged = gpu_check.merge_records([first, again], {"fidelity": "the rule was wrong"})
    assert merged["green"] and merged["stages"]["fidelity"]["passed"]
    assert merged["superseded"] == [{"stage": "fidelity", "reason": "the rule was wrong",
                                     "result": first["stages"]["fidelity"]}]
    failed_again = _record(("fidelity",), passed=False)
    assert not gpu_check.merge_records([first, failed_again], {"fidelity": "again"})["green"]
    once = gpu_check.merge_records([_record(tuple(stages))], {"fidelity": "never ran again"})
    assert "named as run again, but ran once: fidelity" in once["problems"] and not once["green"]


def test_a_rerun_without_a_reason_is_refused(tmp_path: Path, gpu_check) -> None:
    path = tmp_path / "a.json"
    path.write_text(json.dumps(_record(tuple(gpu_check.STAGE_LIMITS))))
    proc = subprocess.run([sys.executable, str(SCRIPT), "--merge", str(path), "--json", str(tmp_path / "m.json"),
                           "--rerun", "fidelity"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "STAGE=WHY" in proc.stderr


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
