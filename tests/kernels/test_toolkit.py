"""The toolkit is found by asking nvcc (through wrappers), CUDA_HOME overrides, the probe is memoised."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kernels.jit import toolkit
from kernels.jit.errors import ToolkitNotFoundError
from tests.kernels.conftest import needs_nvcc


@needs_nvcc
def test_finds_the_real_toolkit_behind_the_nvcc_on_path(jit_env) -> None:
    found = toolkit.find_toolkit()
    assert Path(found.nvcc).is_file() and Path(found.nvcc).parent == Path(found.root) / "bin"
    assert found.root == str(Path(found.root).resolve())
    assert found.version.startswith(found.release + ".")
    assert found.root in found.describe() and found.version in found.describe()
    assert any(Path(d).name == "lib" or "lib" in d for d in found.library_dirs)
    if Path(found.launcher).resolve() != Path(found.nvcc).resolve():
        assert "reached through" in found.describe()  # a wrapper script is named as such


@needs_nvcc
def test_cuda_home_overrides_the_search(jit_env, monkeypatch) -> None:
    root = toolkit.find_toolkit().root
    monkeypatch.setenv("CUDA_HOME", root)
    toolkit.clear_cache()
    found = toolkit.find_toolkit()
    assert found.source == "CUDA_HOME" and found.root == root


def test_cuda_home_without_nvcc_fails_clearly(jit_env, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "nowhere"))
    with pytest.raises(ToolkitNotFoundError, match="CUDA_HOME"):
        toolkit.find_toolkit()


@needs_nvcc
def test_probe_is_memoised_across_processes(jit_env, monkeypatch) -> None:
    first = toolkit.find_toolkit()
    assert (jit_env / "cache" / "toolkit-probe.json").is_file()
    toolkit.clear_cache()

    def no_probe(*args, **kwargs):
        raise AssertionError("probed again despite a valid memo")

    monkeypatch.setattr(toolkit, "probe", no_probe)
    assert toolkit.find_toolkit() == first


@needs_nvcc
def test_memo_is_ignored_when_the_compiler_changes(jit_env, monkeypatch, tmp_path) -> None:
    first = toolkit.find_toolkit()
    fake_home = tmp_path / "cuda"
    (fake_home / "bin").mkdir(parents=True)
    wrapper = fake_home / "bin" / "nvcc"
    wrapper.write_text(f'#!/bin/sh\nexec "{first.nvcc}" "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(fake_home))
    toolkit.clear_cache()
    found = toolkit.find_toolkit()  # a wrapper in CUDA_HOME: the real root is still reported
    assert found.root == first.root and found.launcher == str(wrapper)
    os.utime(wrapper, (1, 1))
    toolkit.clear_cache()
    calls = []
    original = toolkit.probe
    monkeypatch.setattr(toolkit, "probe", lambda *a: calls.append(a) or original(*a))
    toolkit.find_toolkit()
    assert calls  # the launcher's stat changed: probed again
