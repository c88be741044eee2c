"""The JIT lifecycle on a CPU machine: build for sm_86 + sm_90, cache hits, rebuilds, switches, locks."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.kernels.conftest import (BUILD_SNIPPET, REPO_ROOT, copy_cache, find_cuobjdump, needs_nvcc, python_env,
                                    run_python, tiny_spec)

pytestmark = needs_nvcc


def _meta(cache: Path) -> dict:
    return json.loads((cache / "tiny__dtype_fp32" / "meta.json").read_text())


def test_builds_sass_for_sm86_and_sm90_and_ptx_for_the_newest(prebuilt) -> None:
    from kernels.jit.toolkit import find_toolkit

    assert prebuilt["report"]["origin"] == "built"
    assert prebuilt["report"]["answer"] == 42  # the library loads and its host code runs without a GPU
    meta = _meta(prebuilt["cache"])
    assert meta["identity"]["archs"] == ["8.6", "9.0"]
    toolkit = find_toolkit()
    assert meta["identity"]["toolkit_root"] == toolkit.root
    assert meta["identity"]["nvcc_version"] == toolkit.version
    assert toolkit.root in meta["toolkit"]
    ninja = next(prebuilt["cache"].glob("tiny__dtype_fp32/build-*/build.ninja")).read_text()
    for flag in ("arch=compute_86,code=sm_86", "arch=compute_90,code=sm_90", "arch=compute_90,code=compute_90"):
        assert flag in ninja
    tool = find_cuobjdump(toolkit.root)
    if tool:
        artefact = prebuilt["cache"] / "tiny__dtype_fp32" / meta["artefact"]
        elf = subprocess.run([tool, "--list-elf", str(artefact)], capture_output=True, text=True).stdout
        ptx = subprocess.run([tool, "--list-ptx", str(artefact)], capture_output=True, text=True).stdout
        assert "sm_86" in elf and "sm_90" in elf
        assert "sm_90" in ptx and "sm_86" not in ptx


def test_second_build_is_a_cache_hit_in_a_new_process(prebuilt, tmp_path) -> None:
    cache = copy_cache(prebuilt, tmp_path)
    before = _meta(cache)
    out = run_python(BUILD_SNIPPET.format(source=str(prebuilt["source"]), archs="8.6 9.0"),
                     {"DITGATE_KERNELS_CACHE_DIR": str(cache), "DITGATE_KERNELS_GEN_DIR": str(tmp_path / "gen")})
    assert out["origin"] == "cache"
    assert _meta(cache) == before


def test_in_process_cache_returns_the_loaded_module(prebuilt, jit_env) -> None:
    copy_cache(prebuilt, jit_env)
    spec = tiny_spec(prebuilt["source"])
    first = spec.build_and_load("8.6 9.0")
    assert first.origin == "cache"
    assert spec.build_and_load("8.6 9.0") is first
    assert first.lib.answer() == 42


def test_source_change_rebuilds(prebuilt, jit_env) -> None:
    copy_cache(prebuilt, jit_env)
    source = jit_env / "tiny.cu"
    shutil.copy(prebuilt["source"], source)
    spec = tiny_spec(source)
    old = spec.plan("8.6 9.0")
    # the copy has the same content, so the same identity: a cache hit whatever the path or mtime
    assert spec.check_cached(old)[0] is not None
    source.write_text(source.read_text().replace("#define ANSWER 42", "#define ANSWER 43"))
    new = spec.plan("8.6 9.0")
    assert new.digest != old.digest
    assert spec.check_cached(new)[1].startswith("stale")
    module = spec.build_and_load("8.6 9.0")
    assert module.origin == "built" and module.lib.answer() == 43
    assert not old.artefact.exists()  # the superseded library is cleaned up


def test_flag_change_rebuilds(prebuilt, jit_env) -> None:
    copy_cache(prebuilt, jit_env)
    module = tiny_spec(prebuilt["source"], cflags=("-DANSWER=7",)).build_and_load("8.6 9.0")
    assert module.origin == "built" and module.lib.answer() == 7
    assert "-DANSWER=7" in _meta(jit_env / "cache")["identity"]["cflags"]


def test_unsupported_arch_list_fails_clearly_before_compiling(tiny_source, jit_env) -> None:
    from kernels.jit import UnsupportedArchError

    with pytest.raises(UnsupportedArchError) as info:
        tiny_spec(tiny_source).build_and_load("7.5 12.0")
    text = str(info.value)
    assert "tiny__dtype_fp32" in text and "7.5, 12.0" in text and "8.6, 9.0" in text
    assert not (jit_env / "cache" / "tiny__dtype_fp32").exists()


def test_arch_filter_keeps_only_supported_archs(tiny_source, jit_env, monkeypatch) -> None:
    monkeypatch.setenv("DITGATE_KERNELS_ARCHS", "8.0 9.0")
    plan = tiny_spec(tiny_source).plan()
    assert plan.archs == ((9, 0),)


def test_no_compile_switch_fails_naming_module_and_artefact(tiny_source, jit_env, monkeypatch) -> None:
    from kernels.jit import MissingJitCacheError

    monkeypatch.setenv("DITGATE_KERNELS_NO_COMPILE", "1")
    with pytest.raises(MissingJitCacheError) as info:
        tiny_spec(tiny_source).build_and_load("9.0")
    assert "tiny__dtype_fp32" in str(info.value) and "missing" in str(info.value)
    assert str(info.value.artefact).endswith(".so")
    assert not list((jit_env / "cache").glob("*/build-*"))


def test_no_compile_switch_loads_a_valid_cache(prebuilt, jit_env, monkeypatch) -> None:
    copy_cache(prebuilt, jit_env)
    monkeypatch.setenv("DITGATE_KERNELS_NO_COMPILE", "1")
    assert tiny_spec(prebuilt["source"]).build_and_load("8.6 9.0").origin == "cache"


def test_no_cache_switch_builds_in_a_fresh_temporary_folder_removed_at_exit(prebuilt, tmp_path) -> None:
    """The build runs in a process of its own, so its exit handlers run: each run that ignored the cache
    left its ``ditgate-kernels-nocache-*`` folder in the temporary folder before."""
    cache, scratch = copy_cache(prebuilt, tmp_path), tmp_path / "tmp"
    scratch.mkdir()
    out = run_python(BUILD_SNIPPET.format(source=str(prebuilt["source"]), archs="9.0"),
                     {"DITGATE_KERNELS_CACHE_DIR": str(cache), "DITGATE_KERNELS_GEN_DIR": str(tmp_path / "gen"),
                      "DITGATE_KERNELS_NO_CACHE": "1", "TMPDIR": str(scratch)})
    assert out["origin"] == "built-nocache" and out["answer"] == 42
    assert scratch in Path(out["path"]).parents  # built in the scratch folder, not in the cache
    assert sorted(p.name for p in cache.iterdir()) == sorted(p.name for p in prebuilt["cache"].iterdir())
    assert list(scratch.iterdir()) == []  # and the folder went with the process


def test_corrupt_artefact_or_metadata_is_rebuilt_not_loaded(prebuilt, jit_env) -> None:
    cache = copy_cache(prebuilt, jit_env)
    spec = tiny_spec(prebuilt["source"])
    plan = spec.plan("8.6 9.0")
    plan.artefact.write_bytes(plan.artefact.read_bytes()[:1000])
    assert spec.try_load(plan) is None
    assert "checksum" in spec.check_cached(plan)[1]
    module = spec.build_and_load("8.6 9.0")
    assert module.origin == "built" and module.lib.answer() == 42
    (cache / "tiny__dtype_fp32" / "meta.json").write_text("{not json")
    assert spec.try_load(plan) is None


HOLD_LOCK = r"""
import sys, time
from filelock import FileLock
lock = FileLock(sys.argv[1], thread_local=False)
lock.acquire()
print("locked", flush=True)
time.sleep(600)
"""


def _hold_lock(path: Path) -> subprocess.Popen:
    path.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_held_lock_times_out_naming_the_lock_file(tiny_source, jit_env, monkeypatch) -> None:
    from kernels.jit import LockTimeoutError

    spec = tiny_spec(tiny_source)
    plan = spec.plan("9.0")
    holder = _hold_lock(plan.lock_path)
    try:
        monkeypatch.setenv("DITGATE_KERNELS_LOCK_TIMEOUT", "0.5")
        with pytest.raises(LockTimeoutError, match=str(plan.lock_path)):
            spec.build_and_load("9.0")
    finally:
        holder.kill()
        holder.wait()


def test_lock_left_by_a_killed_build_does_not_deadlock(tiny_source, jit_env, monkeypatch) -> None:
    spec = tiny_spec(tiny_source)
    plan = spec.plan("9.0")
    holder = _hold_lock(plan.lock_path)
    os.kill(holder.pid, signal.SIGKILL)  # dies holding the lock, as a killed build would
    holder.wait()
    assert plan.lock_path.exists()  # the lock file is left behind ...
    monkeypatch.setenv("DITGATE_KERNELS_LOCK_TIMEOUT", "120")
    started = time.monotonic()
    module = spec.build_and_load("9.0")  # ... but flock died with its holder
    assert module.origin == "built" and module.lib.answer() == 42
    assert time.monotonic() - started < 120


def test_two_processes_building_at_once_build_once(tiny_source, jit_env) -> None:
    env = python_env({"DITGATE_KERNELS_CACHE_DIR": str(jit_env / "cache"),
                      "DITGATE_KERNELS_GEN_DIR": str(jit_env / "gen")})
    code = BUILD_SNIPPET.format(source=str(tiny_source), archs="9.0")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env, cwd=REPO_ROOT) for _ in range(2)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(r["origin"] for r in results) == ["built", "cache"]
    assert {r["answer"] for r in results} == {42}
    assert results[0]["path"] == results[1]["path"]
    spec = tiny_spec(tiny_source)
    meta, why = spec.check_cached(spec.plan("9.0"))
    assert meta is not None, why  # artefact intact: checksum matches the metadata
