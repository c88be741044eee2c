"""Find the CUDA toolkit that will really compile: ask nvcc, don't trust where it sits on PATH.

``nvcc`` on PATH may be a wrapper script that execs the real compiler elsewhere (it is on this
project's CPU machines), so the toolkit root is read from ``nvcc --dryrun`` (its ``TOP=`` line) and the
version from ``nvcc --version``. ``CUDA_HOME`` overrides the search. The probe costs ~0.1 s, so its result
is remembered in the cache folder keyed by the identity (path, size, mtime, inode) of the launcher and of
the real compiler: a cache-hit load in a new process must stay well under 50 ms.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from kernels.jit import env
from kernels.jit.errors import ToolkitNotFoundError

PROBE_SCHEMA = 1


@dataclass(frozen=True)
class Toolkit:
    """A CUDA toolkit as its own nvcc describes it."""

    root: str  # real toolkit root, symlinks resolved (e.g. /usr/local/cuda-13.0)
    nvcc: str  # the real nvcc binary inside root (used for every compile)
    launcher: str  # what was found first (CUDA_HOME/bin/nvcc or the PATH entry, maybe a wrapper)
    version: str  # full version, e.g. "13.0.88"
    release: str  # "13.0"
    include_dirs: tuple[str, ...]
    library_dirs: tuple[str, ...]
    source: str  # "CUDA_HOME" or "PATH"

    def describe(self) -> str:
        via = "" if self.launcher == self.nvcc else f" (reached through {self.launcher})"
        return f"CUDA {self.version} at {self.root}, nvcc {self.nvcc}{via}, chosen by {self.source}"


def _launcher() -> tuple[str, str]:
    home = os.environ.get("CUDA_HOME")
    if home:
        nvcc = Path(home) / "bin" / "nvcc"
        if not nvcc.is_file():
            raise ToolkitNotFoundError(f"CUDA_HOME={home!r} has no bin/nvcc; point CUDA_HOME at a CUDA toolkit")
        return str(nvcc), "CUDA_HOME"
    found = shutil.which("nvcc")
    if found:
        return found, "PATH"
    fallback = Path("/usr/local/cuda/bin/nvcc")
    if fallback.is_file():
        return str(fallback), "default /usr/local/cuda"
    raise ToolkitNotFoundError("no CUDA toolkit: nvcc is not on PATH and CUDA_HOME is not set")


def _stat_key(path: str) -> list[int | str]:
    st = os.stat(path)
    return [path, st.st_size, st.st_mtime_ns, st.st_ino]


def _run(args: list[str]) -> str:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ToolkitNotFoundError(f"running {' '.join(args)} failed: {exc}") from None
    return done.stdout + done.stderr


def _dryrun_values(text: str) -> dict[str, str]:
    values = {}
    for line in text.splitlines():
        match = re.match(r"#\$ (\w+)=(.*)$", line.strip())
        if match:
            values.setdefault(match.group(1), match.group(2).strip())
    return values


def probe(launcher: str, source: str) -> Toolkit:
    """Ask ``launcher`` (an nvcc or a wrapper around one) for its version, root and folders."""
    version_text = _run([launcher, "--version"])
    match = re.search(r"release (\d+\.\d+), V(\d+\.\d+\.\d+)", version_text)
    if not match:
        raise ToolkitNotFoundError(f"{launcher} --version did not print a CUDA release:\n{version_text[-500:]}")
    dry = _dryrun_values(_run([launcher, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull]))
    top = dry.get("TOP")
    if not top:
        raise ToolkitNotFoundError(f"{launcher} --dryrun printed no TOP= line; cannot locate its toolkit")
    root = Path(top).resolve()
    real_nvcc = root / "bin" / "nvcc"
    if not real_nvcc.is_file():
        raise ToolkitNotFoundError(f"{launcher} reports toolkit root {root}, which has no bin/nvcc")
    includes = tuple(str(Path(p).resolve()) for p in re.findall(r'-I"?([^"\s]+)"?', dry.get("INCLUDES", "")))
    libraries = tuple(str(Path(p).resolve()) for p in re.findall(r'-L"?([^"\s]+)"?', dry.get("LIBRARIES", "")))
    return Toolkit(root=str(root), nvcc=str(real_nvcc), launcher=launcher, version=match.group(2),
                   release=match.group(1), include_dirs=includes, library_dirs=libraries, source=source)


def _memo_path() -> Path:
    return env.cache_dir() / "toolkit-probe.json"


def _memo_key(launcher: str) -> list:
    return [PROBE_SCHEMA, os.environ.get("CUDA_HOME", ""), _stat_key(launcher)]


def _read_memo(launcher: str) -> Toolkit | None:
    try:
        data = json.loads(_memo_path().read_text(encoding="utf-8"))
        entry = data[json.dumps(_memo_key(launcher))]
        if entry["nvcc_stat"] != _stat_key(entry["toolkit"]["nvcc"]):
            return None
        fields = entry["toolkit"]
        fields["include_dirs"] = tuple(fields["include_dirs"])
        fields["library_dirs"] = tuple(fields["library_dirs"])
        return Toolkit(**fields)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_memo(launcher: str, toolkit: Toolkit) -> None:
    from pytest_ditgate.fsutil import atomic_write_json

    path = _memo_path()
    try:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                data = {}
        except (OSError, ValueError):
            data = {}
        data[json.dumps(_memo_key(launcher))] = {"toolkit": asdict(toolkit), "nvcc_stat": _stat_key(toolkit.nvcc)}
        atomic_write_json(path, data)
    except OSError:
        pass  # the memo is an optimisation; a read-only cache folder only costs a probe per process


def find_toolkit() -> Toolkit:
    """The toolkit to compile with: ``CUDA_HOME`` if set, else the one the ``nvcc`` on PATH belongs to."""
    launcher, source = _launcher()
    return _find_cached(launcher, source, str(env.cache_dir()))


@functools.lru_cache(maxsize=8)
def _find_cached(launcher: str, source: str, cache: str) -> Toolkit:
    found = _read_memo(launcher)
    if found is not None:
        return found
    toolkit = probe(launcher, source)
    _write_memo(launcher, toolkit)
    return toolkit


def clear_cache() -> None:
    """Forget in-process probe results (tests change PATH and CUDA_HOME)."""
    _find_cached.cache_clear()
