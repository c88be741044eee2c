"""Red team, part 1: attacks the judge refuses before the candidate's code runs (each in a temporary git
repository copied from one baselined synthetic project; ``judge_project``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import pytest

from judge_project import PYPROJECT, REFERENCE, Project

SLOW_REFERENCE = REFERENCE.replace("range(24)", "range(96)")


def relock(p: Project) -> None:
    """What ``pytest --ditgate --ditgate-relock`` does to the lock (here without a pytest run and its torch
    import: the judge sees only the rewritten file)."""
    from pytest_ditgate.golden.fixed_paths import LockSettings, write_lock

    assert write_lock(LockSettings.from_rootdir(p.root)) > 0


def edit_fixed_and_relock(p: Project) -> dict:
    """Slow the reference down and relock in one commit (the old HEAD^ scope saw only the next no-op)."""
    p.write("reference/work.py", SLOW_REFERENCE)
    relock(p)
    p.commit("reference and lock")
    p.commit("no-op candidate")
    return {}


def relock_uncommitted(p: Project) -> dict:
    p.write("reference/work.py", SLOW_REFERENCE)
    relock(p)
    return {}


def drop_fixed_paths(p: Project) -> dict:
    p.write("pyproject.toml", PYPROJECT.replace('fixed_paths = ["reference/", "fixtures/"]\n', ""))
    p.commit("no fixed paths")
    return {}


def tamper_golden(p: Project) -> dict:
    """Edit a golden file and its manifest's sha256, so the golden store alone would accept it."""
    import hashlib

    path = p.root / "golden" / "cpu" / "case0.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    manifest = json.loads((p.root / "golden" / "manifest.json").read_text())
    text = json.dumps(manifest)
    old = next(v["sha256"] for v in manifest["entries"].values())
    (p.root / "golden" / "manifest.json").write_text(text.replace(old, hashlib.sha256(bytes(data)).hexdigest()))
    p.commit("golden")
    return {}


def conftest_in_mutable(p: Project) -> dict:
    p.write("candidate/conftest.py", "def pytest_collection_modifyitems(items):\n    del items[:]\n")
    p.commit("a conftest inside the mutable paths")
    return {}


def delete_history(p: Project) -> dict:
    shutil.rmtree(p.root / ".ditgate")
    return {}


def edit_history(p: Project) -> dict:
    path = p.root / ".ditgate" / "lanes" / "fwd.jsonl"
    lines = path.read_text().splitlines()
    record = json.loads(lines[-1])
    record["best"]["objective"]["ratio"] = 5.0  # an easy best to beat
    path.write_text("\n".join(lines[:-1] + [json.dumps(record, sort_keys=True)]) + "\n")
    return {}


def delete_tip_ref(p: Project) -> dict:
    assert p.sh("git", "update-ref", "-d", "refs/ditgate/lanes/fwd").returncode == 0
    return {}


def reset_past_baseline(p: Project) -> dict:
    assert p.sh("git", "reset", "-q", "--hard", "HEAD^").returncode == 0  # before the baseline commit
    p.candidate(repeat=4)
    p.commit("candidate on the old base")
    return {}


def edit_outside_mutable(p: Project) -> dict:
    p.write("notes.txt", "scratch\n")
    p.commit("notes")
    return {}


def shadow_on_pythonpath(p: Project) -> dict:
    shadow = p.root.parent / "shadow"
    (shadow / "reference").mkdir(parents=True)
    (shadow / "reference" / "__init__.py").write_text("")
    (shadow / "reference" / "work.py").write_text(SLOW_REFERENCE)
    from judge_project import PLUGIN_SRC

    return {"PYTHONPATH": f"{shadow}:{PLUGIN_SRC}"}


ATTACKS: list[tuple[Callable[[Project], dict], dict, int, str]] = [
    (edit_fixed_and_relock, {}, 12, "reference/work.py: a fixed path"),
    (relock_uncommitted, {}, 12, "fixed_paths.lock.json: a fixed path"),
    (drop_fixed_paths, {}, 12, "fixed paths"),
    (tamper_golden, {}, 12, "golden/"),
    (conftest_in_mutable, {}, 12, "candidate/conftest.py"),
    (delete_history, {}, 12, "missing"),
    (edit_history, {}, 12, "edited history"),
    (delete_tip_ref, {}, 12, "tip ref"),
    (reset_past_baseline, {}, 12, "DISCARD (integrity)"),
    (edit_outside_mutable, {}, 13, "notes.txt: outside the mutable paths"),
    (shadow_on_pythonpath, {}, 12, "PYTHONPATH entry"),
    (lambda p: {}, {"PYTEST_ADDOPTS": "-k speed"}, 12, "PYTEST_ADDOPTS"),
    (lambda p: {}, {"DITGATE_DIR": "/tmp/elsewhere"}, 12, "DITGATE_DIR"),
    (lambda p: {}, {"DITGATE_DEVICE_PROFILE": "h200"}, 12, "DITGATE_DEVICE_PROFILE"),
    (lambda p: {}, {"LD_PRELOAD": "/nonexistent.so"}, 12, "LD_PRELOAD"),
]


@pytest.mark.slow
@pytest.mark.parametrize("attack, env, code, words", ATTACKS,
                         ids=[a[0].__name__ if a[0].__name__ != "<lambda>" else next(iter(a[1])) for a in ATTACKS])
def test_attack_is_refused_before_the_candidate_runs(judged: Project, attack, env, code, words) -> None:
    env = {**attack(judged), **env}
    result = judged.experiment(**env)
    assert result.returncode == code, result.stdout[-3000:] + result.stderr[-2000:]
    assert words in result.stdout
    assert "judged run:" not in result.stdout  # refused before the child ran
    if (judged.root / ".ditgate" / "verdict.json").exists() and not env.get("DITGATE_DIR"):
        assert judged.verdict()["verdict"]["exit_code"] == code
        assert judged.statuses()[-1] == judged.verdict()["verdict"]["label"]


def test_refused_variables_are_recorded_in_the_verdict(judged: Project) -> None:
    result = judged.experiment(PYTEST_ADDOPTS="-k speed")
    assert result.returncode == 12
    assert judged.verdict()["environment"]["variables"]["PYTEST_ADDOPTS"] == "-k speed"


def test_a_baseline_is_recorded_once_and_lanes_come_from_the_project(judged: Project) -> None:
    again = judged.ditgate("baseline", "--lane", "fwd")
    assert again.returncode == 2 and "already has a baseline" in again.stderr
    unknown = judged.ditgate("experiment", "--lane", "nope")
    assert unknown.returncode == 4 and "not declared in [tool.ditgate.lanes]" in unknown.stderr
