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
