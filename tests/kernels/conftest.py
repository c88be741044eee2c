"""Fixtures of the CPU tests of kernels/: isolated JIT workspaces and a tiny raw-pointer CUDA module.

The module is compiled (not run: no GPU here) with the real nvcc; each variant is built once per session
where the test does not need its own build.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TINY_SOURCE = r"""
#include <cuda_runtime.h>
#ifndef ANSWER
#define ANSWER 42
#endif
__global__ void touch(int* p) { p[threadIdx.x] = ANSWER; }
extern "C" __attribute__((visibility("default"))) int answer(void) { return ANSWER; }
extern "C" __attribute__((visibility("default"))) int launch(int* p, void* stream) {
  touch<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(p);
  return static_cast<int>(cudaGetLastError());
}
"""

ENV_VARS = ("DITGATE_KERNELS_CACHE_DIR", "DITGATE_KERNELS_GEN_DIR", "DITGATE_KERNELS_ARCHS",
            "DITGATE_KERNELS_NO_COMPILE", "DITGATE_KERNELS_NO_CACHE", "DITGATE_KERNELS_LOCK_TIMEOUT",
            "DITGATE_KERNELS_LOGLEVEL", "DITGATE_KERNELS_LINEINFO")


def _has_nvcc() -> bool:
    from kernels.jit.errors import ToolkitNotFoundError
    from kernels.jit.toolkit import _launcher

    try:
        _launcher()
        return True
    except ToolkitNotFoundError:
        return False


needs_nvcc = pytest.mark.skipif(not _has_nvcc(), reason="no CUDA toolkit (nvcc) on this machine")


@pytest.fixture
def jit_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Fresh cache and gen workspaces under ``tmp_path``; every kernels switch unset."""
    from kernels.jit import spec, toolkit

    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DITGATE_KERNELS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DITGATE_KERNELS_GEN_DIR", str(tmp_path / "gen"))
    spec.clear_loaded()
    toolkit.clear_cache()
    yield tmp_path
    spec.clear_loaded()
    toolkit.clear_cache()


def tiny_spec(source: Path, name: str = "tiny__dtype_fp32", cflags: tuple[str, ...] = ()):
    from kernels.jit import JitSpec

    return JitSpec(name=name, sources=(source,), cflags=cflags, supported_archs=((8, 6), (9, 0)))


@pytest.fixture
def tiny_source(tmp_path: Path) -> Path:
    path = tmp_path / "src" / "tiny.cu"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(TINY_SOURCE)
    return path


@pytest.fixture(scope="session")
def prebuilt(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The tiny module built once for sm_86 + sm_90 in a session cache (copy it before changing it)."""
    if not _has_nvcc():
        pytest.skip("no CUDA toolkit (nvcc) on this machine")
    root = tmp_path_factory.mktemp("prebuilt")
    source = root / "src" / "tiny.cu"
    source.parent.mkdir()
    source.write_text(TINY_SOURCE)
    env = {"DITGATE_KERNELS_CACHE_DIR": str(root / "cache"), "DITGATE_KERNELS_GEN_DIR": str(root / "gen")}
    out = run_python(BUILD_SNIPPET.format(source=str(source), archs="8.6 9.0"), env)
    return {"root": root, "source": source, "cache": root / "cache", "gen": root / "gen", "report": out}


BUILD_SNIPPET = r"""
import json, sys
from pathlib import Path
from kernels.jit import JitSpec
spec = JitSpec(name="tiny__dtype_fp32", sources=(Path({source!r}),), supported_archs=((8, 6), (9, 0)))
module = spec.build_and_load({archs!r})
print(json.dumps({{"origin": module.origin, "path": str(module.path), "answer": module.lib.answer()}}))
"""


REPO_ROOT = Path(__file__).resolve().parents[2]


def python_env(env: dict[str, str]) -> dict[str, str]:
    """This process's environment without the kernels switches, plus ``env``, with the repository on the path."""
    import os

    full_env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    full_env.update(env)
    full_env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "src"), full_env.get("PYTHONPATH", "")])
    return full_env


def run_python(code: str, env: dict[str, str], timeout: float = 300) -> dict:
    """Run ``code`` in a new interpreter (repository root on sys.path) and parse its last stdout line."""
    import json

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=python_env(env),
                          timeout=timeout, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def find_cuobjdump(toolkit_root: str) -> str | None:
    """``cuobjdump`` of the toolkit, on PATH, or the copy triton's pip package ships for its NVIDIA backend."""
    for candidate in (Path(toolkit_root) / "bin" / "cuobjdump", shutil.which("cuobjdump")):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    try:
        import triton
    except ImportError:
        return None
    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(bundled) if bundled.is_file() else None


def copy_cache(prebuilt: dict, dest: Path) -> Path:
    shutil.copytree(prebuilt["cache"], dest / "cache", dirs_exist_ok=True)
    return dest / "cache"
