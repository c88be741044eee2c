"""A compiled module's spec and its one build-and-load lifecycle.

Contract (after FlashInfer's ``JitSpec``):

* :meth:`JitSpec.try_load` returns ``None`` for a missing, stale or corrupt artefact and never raises
  for those;
* :meth:`JitSpec.build` is idempotent and does not take the lock (the caller holds it);
* :meth:`JitSpec.load` raises real errors (a library that exists, matches its metadata and still fails
  to load is a bug to see, not to paper over with a rebuild).

:meth:`JitSpec.build_and_load` runs ``try_load`` -> file lock -> ``try_load`` again (another process may
have built it meanwhile) -> kill switch (``DITGATE_KERNELS_NO_COMPILE``) -> ``build`` -> ``load``.

The cache identity is a sha256 over the *content* of sources, headers and generated files, the flags,
the target archs, the nvcc version, the toolkit root, the torch version and this library's version;
never file times. Metadata beside the artefact records it and is checked, with the artefact's own
sha256, before every load.
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from kernels.jit import arch as arch_mod
from kernels.jit import builder, env
from kernels.jit.errors import JitError, LockTimeoutError, MissingJitCacheError
from kernels.jit.toolkit import Toolkit, find_toolkit

log = logging.getLogger("kernels.jit")

META_SCHEMA = 1
BASE_CFLAGS = ("-O3", "-std=c++17", "-DNDEBUG", "-Xcompiler", "-fPIC", "-Xcompiler", "-fvisibility=hidden")
BASE_LDFLAGS = ("-shared", "-cudart=static", "-Xcompiler", "-fPIC")
#: Ampere and newer: what the bundled kernels are written and tested for
DEFAULT_ARCHS: tuple[arch_mod.Arch, ...] = ((8, 0), (8, 6), (8, 7), (8, 9), (9, 0), (10, 0), (12, 0))


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def library_version() -> str:
    from kernels import __version__

    return __version__


def torch_version() -> str | None:
    """torch's version from its metadata (no import: a cache-hit load must stay cheap)."""
    import importlib.metadata

    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class BuildPlan:
    """A spec resolved for one call: toolkit, target archs, identity and every path it touches."""

    spec: "JitSpec"
    archs: tuple[arch_mod.Arch, ...]
    toolkit: Toolkit
    identity: dict[str, Any]
    digest: str
    cache_root: Path
    gen_root: Path

    @property
    def module_dir(self) -> Path:
        return self.cache_root / self.spec.name

    @property
    def meta_path(self) -> Path:
        return self.module_dir / "meta.json"

    @property
    def artefact(self) -> Path:
        # the digest is in the file name: dlopen caches by path, so a rebuilt library needs a new one
        return self.module_dir / f"lib{self.spec.name}.{self.digest[:16]}.so"

    @property
    def build_dir(self) -> Path:
        return self.module_dir / f"build-{self.digest[:16]}"

    @property
    def gen_dir(self) -> Path:
        return self.gen_root / self.spec.name

    @property
    def lock_path(self) -> Path:
        return self.cache_root / "tmp" / f"{self.spec.name}.lock"


class LoadedModule:
    """A loaded shared library plus its metadata; ``function`` returns typed ctypes entry points."""

    def __init__(self, name: str, path: Path, meta: dict[str, Any], origin: str) -> None:
        self.name = name
        self.path = path
        self.meta = meta
        self.origin = origin  # "cache", "built" or "built-nocache"
        self.lib = ctypes.CDLL(str(path))
        self._functions: dict[str, Any] = {}

    def function(self, symbol: str, argtypes: Sequence[Any], restype: Any = ctypes.c_int) -> Any:
        fn = self._functions.get(symbol)
        if fn is None:
            try:
                fn = getattr(self.lib, symbol)
            except AttributeError:
                raise JitError(f"kernel module {self.name!r} ({self.path}) exports no symbol {symbol!r}") from None
            fn.argtypes = list(argtypes)
            fn.restype = restype
            self._functions[symbol] = fn
        return fn

    def __repr__(self) -> str:
        return f"LoadedModule({self.name!r}, origin={self.origin!r}, path={str(self.path)!r})"


_LOADED: dict[tuple[str, str], LoadedModule] = {}
_LOADED_LOCK = threading.Lock()


def clear_loaded() -> None:
    """Forget modules loaded in this process (the libraries stay mapped; tests use this)."""
    with _LOADED_LOCK:
        _LOADED.clear()


@dataclass(frozen=True)
class JitSpec:
    """What to compile for one module: its URI, sources, generated files, flags and supported archs."""

    name: str
    sources: tuple[Path, ...]
    headers: tuple[Path, ...] = ()
    generated: tuple[tuple[str, str], ...] = ()
    cflags: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = ()
    supported_archs: tuple[arch_mod.Arch, ...] = DEFAULT_ARCHS
    include_dirs: tuple[Path, ...] = ()
    params: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        names = [Path(s).name for s in self.sources] + [n for n, _ in self.generated]
        if len(names) != len(set(names)):
            raise ValueError(f"kernel module {self.name!r}: two sources or generated files share a file name")
        if not self.sources:
            raise ValueError(f"kernel module {self.name!r} has no sources")

    # ---- identity -------------------------------------------------------------------------------
    def semantic_cflags(self) -> list[str]:
        """Flags that change the generated code (include paths and job counts do not)."""
        flags = list(BASE_CFLAGS) + list(self.cflags)
        if env.lineinfo():
            flags.append("-lineinfo")
        return flags

    def identity(self, archs: Sequence[arch_mod.Arch], toolkit: Toolkit) -> dict[str, Any]:
        def contents(paths: Sequence[Path]) -> dict[str, str]:
            out = {}
            for path in paths:
                try:
                    out[Path(path).name] = _sha256_file(Path(path))
                except OSError as exc:
                    raise JitError(f"kernel module {self.name!r}: cannot read source {path}: {exc}") from None
            return out

        return {
            "schema": META_SCHEMA,
            "name": self.name,
            "params": dict(self.params),
            "sources": contents(self.sources),
            "headers": contents(self.headers),
            "generated": {name: _sha256_bytes(text.encode()) for name, text in self.generated},
            "cflags": self.semantic_cflags(),
            "ldflags": list(BASE_LDFLAGS) + list(self.ldflags),
            "archs": [f"{a}.{b}" for a, b in archs],
            "nvcc_version": toolkit.version,
            "toolkit_root": toolkit.root,
            "torch_version": torch_version(),
            "library_version": library_version(),
        }

    def plan(self, archs: str | Sequence[str | arch_mod.Arch] | None = None, *,
             cache_root: Path | None = None, gen_root: Path | None = None) -> BuildPlan:
        """Resolve toolkit and archs (raising :class:`UnsupportedArchError` early) and the identity."""
        chosen = tuple(arch_mod.select_archs(self.name, self.supported_archs, archs))
        toolkit = find_toolkit()
        identity = self.identity(chosen, toolkit)
        digest = _sha256_bytes(json.dumps(identity, sort_keys=True).encode())
        return BuildPlan(self, chosen, toolkit, identity, digest,
                         cache_root or env.cache_dir(), gen_root or env.gen_dir())

    # ---- lifecycle ------------------------------------------------------------------------------
    def check_cached(self, plan: BuildPlan) -> tuple[dict[str, Any] | None, str]:
        """The cached metadata if the artefact is valid for ``plan``, else None and why not."""
        try:
            meta = json.loads(plan.meta_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None, "missing"
        except (OSError, ValueError):
            return None, "corrupt metadata"
        if not isinstance(meta, dict) or meta.get("schema") != META_SCHEMA:
            return None, "corrupt metadata"
        if meta.get("digest") != plan.digest:
            return None, "stale (sources, flags, archs or toolchain changed)"
        artefact = plan.module_dir / str(meta.get("artefact", ""))
        if artefact != plan.artefact:
            return None, "corrupt metadata"
        try:
            if _sha256_file(artefact) != meta.get("artefact_sha256"):
                return None, "corrupt artefact (checksum mismatch)"
        except OSError:
            return None, "missing artefact"
        return meta, "valid"

    def try_load(self, plan: BuildPlan) -> LoadedModule | None:
        """The cached module, or None when it is missing, stale or corrupt (never raises for those)."""
        meta, why = self.check_cached(plan)
        if meta is None:
            log.debug("kernel module %s: no usable cache entry (%s)", self.name, why)
            return None
        return self.load(plan, meta, origin="cache")

    def load(self, plan: BuildPlan, meta: dict[str, Any], *, origin: str = "cache") -> LoadedModule:
        """Load the artefact of ``plan`` described by its checked ``meta``; real failures raise."""
        try:
            module = LoadedModule(self.name, plan.artefact, meta, origin)
        except OSError as exc:
            raise JitError(f"kernel module {self.name!r}: loading {plan.artefact} failed: {exc}") from None
        log.info("kernel module %s: loaded %s (%s)", self.name, plan.artefact, origin)
        return module

    def _write_sources(self, plan: BuildPlan) -> list[Path]:
        """Generated files and copies of the compile units in the gen folder (written only on change)."""
        from pytest_ditgate.fsutil import atomic_write_bytes

        plan.gen_dir.mkdir(parents=True, exist_ok=True)
        items = [(name, text.encode()) for name, text in self.generated]
        items += [(Path(src).name, Path(src).read_bytes()) for src in self.sources]
        for name, data in items:
            target = plan.gen_dir / name
            try:
                same = target.read_bytes() == data
            except OSError:
                same = False
            if not same:
                atomic_write_bytes(target, data)
        return [plan.gen_dir / Path(src).name for src in self.sources]

    def commands(self, plan: BuildPlan, units: Sequence[Path]) -> builder.BuildCommands:
        jobs = env.max_jobs()
        threads = max(1, min(len(plan.archs) + 1, jobs // max(1, min(len(units), jobs))))
        includes = [f"-I{plan.gen_dir}"] + [f"-I{d}" for d in self.include_dirs]
        flags = tuple(self.semantic_cflags() + arch_mod.gencode_flags(plan.archs) + includes
                      + ["--threads", str(threads)])
        compiles = tuple((str(u), str(plan.build_dir / (u.stem + ".o")), flags) for u in units)
        link = tuple(list(BASE_LDFLAGS) + list(self.ldflags))
        return builder.BuildCommands(plan.toolkit.nvcc, compiles, link, str(plan.build_dir / f"lib{self.name}.so"))

    def build(self, plan: BuildPlan) -> dict[str, Any]:
        """Compile into the build folder, then publish artefact and metadata atomically. Idempotent."""
        from pytest_ditgate.fsutil import atomic_write_json

        meta, _ = self.check_cached(plan)
        if meta is not None:
            return meta
        log.info("kernel module %s: compiling for sm_%s with %s", self.name,
                 ", sm_".join(f"{a}{b}" for a, b in plan.archs), plan.toolkit.describe())
        started = time.perf_counter()
        units = self._write_sources(plan)
        commands = self.commands(plan, units)
        tool = builder.run_build(self.name, plan.build_dir, commands, env.max_jobs())
        built = Path(commands.output)
        fd, tmp = tempfile.mkstemp(prefix=f".{plan.artefact.name}.", suffix=".tmp", dir=plan.module_dir)
        os.close(fd)
        try:
            shutil.copyfile(built, tmp)
            os.chmod(tmp, 0o755)
            os.replace(tmp, plan.artefact)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        meta = {
            "schema": META_SCHEMA,
            "name": self.name,
            "digest": plan.digest,
            "identity": plan.identity,
            "artefact": plan.artefact.name,
            "artefact_sha256": _sha256_file(plan.artefact),
            "artefact_bytes": plan.artefact.stat().st_size,
            "toolkit": plan.toolkit.describe(),
            "nvcc": plan.toolkit.nvcc,
            "builder": tool,
            "build_dir": str(plan.build_dir),
            "build_seconds": round(time.perf_counter() - started, 3),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "pid": os.getpid(),
        }
        atomic_write_json(plan.meta_path, meta)
        for old in plan.module_dir.glob(f"lib{self.name}.*.so"):
            if old != plan.artefact:
                old.unlink(missing_ok=True)  # a process that loaded it keeps its mapping
        log.info("kernel module %s: built in %.1f s -> %s", self.name, meta["build_seconds"], plan.artefact)
        return meta

    def build_and_load(self, archs: str | Sequence[str | arch_mod.Arch] | None = None) -> LoadedModule:
        """The one lifecycle: memory -> try_load -> lock -> try_load -> kill switch -> build -> load."""
        if env.no_cache():
            return self._build_uncached(archs)
        plan = self.plan(archs)
        key = (self.name, plan.digest)
        with _LOADED_LOCK:
            module = _LOADED.get(key)
        if module is not None:
            return module
        module = self.try_load(plan)
        if module is None:
            module = self._locked_build_and_load(plan)
        with _LOADED_LOCK:
            return _LOADED.setdefault(key, module)

    def _locked_build_and_load(self, plan: BuildPlan) -> LoadedModule:
        from filelock import FileLock, Timeout

        plan.lock_path.parent.mkdir(parents=True, exist_ok=True)
        plan.module_dir.mkdir(parents=True, exist_ok=True)
        try:
            with FileLock(str(plan.lock_path), thread_local=False, timeout=env.lock_timeout()):
                module = self.try_load(plan)
                if module is not None:
                    return module
                if env.no_compile():
                    _, why = self.check_cached(plan)
                    raise MissingJitCacheError(self.name, plan.artefact, why)
                meta = self.build(plan)
                return self.load(plan, meta, origin="built")
        except Timeout:
            raise LockTimeoutError(
                f"kernel module {self.name!r}: waited {env.lock_timeout():.0f} s for the build lock "
                f"{plan.lock_path} held by another process ({env.LOCK_TIMEOUT} sets the wait)") from None

    def _build_uncached(self, archs: str | Sequence[str | arch_mod.Arch] | None) -> LoadedModule:
        root = _scratch_root(self.name)
        plan = self.plan(archs, cache_root=root / "cache", gen_root=root / "generated")
        if env.no_compile():
            raise MissingJitCacheError(self.name, plan.artefact,
                                       "DITGATE_KERNELS_NO_CACHE=1 ignores the cache")
        plan.module_dir.mkdir(parents=True, exist_ok=True)
        log.warning("kernel module %s: DITGATE_KERNELS_NO_CACHE=1, building in %s", self.name, root)
        meta = self.build(plan)
        return self.load(plan, meta, origin="built-nocache")


def _scratch_root(name: str) -> Path:
    """A fresh build folder for ``DITGATE_KERNELS_NO_CACHE=1``, removed when the process exits (a loaded
    library stays mapped once its file is gone): a run that ignores the cache leaves nothing behind."""
    root = Path(tempfile.mkdtemp(prefix=f"ditgate-kernels-nocache-{name}-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


def module_uri(op: str, **params: Any) -> str:
    """Deterministic module name from the op and its specialisation parameters (order-independent)."""
    import re

    def clean(value: Any) -> str:
        text = str(value).lower()
        if not re.fullmatch(r"[a-z0-9.]+", text):
            raise ValueError(f"specialisation value {value!r} must be letters, digits and dots")
        return text.replace(".", "p")

    if not re.fullmatch(r"[a-z][a-z0-9_]*", op):
        raise ValueError(f"op name {op!r} must be lower-case letters, digits and underscores")
    parts = [op] + [f"{key}_{clean(params[key])}" for key in sorted(params)]
    for key in params:
        if not re.fullmatch(r"[a-z][a-z0-9]*", key):
            raise ValueError(f"specialisation parameter name {key!r} must be lower-case letters and digits")
    return "__".join(parts)
