"""Device requirements of a test (the keywords of ``@pytest.mark.requires_gpu``), parsed and evaluated.

Pure functions over :class:`~pytest_ditgate.device_info.DeviceInfo`: no torch, no pytest state. Parsing
rejects unknown keys and malformed specs; evaluation returns the exact list of what is missing.
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass
from typing import Any, Callable

from pytest_ditgate.device_info import SDPA_BACKENDS, DeviceInfo
from pytest_ditgate.errors import DitgateUsageError
from pytest_ditgate.numbers import finite_number
from pytest_ditgate.toolchain import package_version

_OPS: dict[str, Callable[[Any, Any], bool]] = {
    ">=": operator.ge, "<=": operator.le, "==": operator.eq, "!=": operator.ne, ">": operator.gt, "<": operator.lt,
}
_SDPA_ALIASES = {
    "flash": "flash", "flash_attention": "flash",
    "efficient": "efficient", "mem_efficient": "efficient", "memory_efficient": "efficient",
    "cudnn": "cudnn", "cudnn_attention": "cudnn",
    "math": "math",
}

Version = tuple[int, ...]


def parse_version(text: str, *, arch: bool = False) -> Version:
    """``"8.6"`` or ``"12.4.1"`` -> tuple of ints; with ``arch``, also ``"sm_86"`` and ``"86"``."""
    raw = str(text).strip().lower()
    if arch and raw.startswith("sm"):
        digits = raw[3:] if raw.startswith("sm_") else raw[2:]
        if not digits.isdigit() or len(digits) < 2:
            raise DitgateUsageError(f"bad arch {text!r}: expected like 'sm_86'")
        return (int(digits[:-1]), int(digits[-1]))
    if arch and raw.isdigit() and len(raw) >= 2:
        return (int(raw[:-1]), int(raw[-1]))
    parts = raw.split(".")
    if not all(part.isdigit() for part in parts):
        raise DitgateUsageError(f"bad version {text!r}: expected numbers like '8.6'")
    return tuple(int(part) for part in parts)


def _fmt(version: Version) -> str:
    return ".".join(str(x) for x in version)


@dataclass(frozen=True)
class VersionSpec:
    """A version condition: clauses that must all hold (``>=8.0,<9.0``), or a list of alternatives."""

    alternatives: tuple[tuple[tuple[str, Version], ...], ...]
    text: str

    def matches(self, version: Version) -> bool:
        def holds(op: str, bound: Version) -> bool:
            width = max(len(version), len(bound))
            left = version + (0,) * (width - len(version))
            right = bound + (0,) * (width - len(bound))
            if op == "==" and len(bound) < len(version):  # "==12" matches 12.x
                left = version[: len(bound)]
                right = bound
            return _OPS[op](left, right)

        return any(all(holds(op, bound) for op, bound in clauses) for clauses in self.alternatives)


_CLAUSE = re.compile(r"^\s*(>=|<=|==|!=|>|<)?\s*([A-Za-z_]*[\d.]+)\s*$")


def parse_version_spec(spec: Any, *, what: str, arch: bool = False) -> VersionSpec:
    """Parse ``">=8.0"``, ``"==8.6"``, ``"8.0-8.9"`` (inclusive range), ``">=8.0,<9.0"`` or a list (any of)."""
    items = list(spec) if isinstance(spec, (list, tuple, set, frozenset)) else [spec]
    if not items:
        raise DitgateUsageError(f"{what}: empty list")
    alternatives = []
    for item in items:
        if isinstance(item, (int, float)) and not isinstance(item, bool) and arch:
            raise DitgateUsageError(f"{what}: a bare number {item!r} is ambiguous (this capability or newer? exactly "
                                    f"it?); write a string: {_number_forms(item)}")
        if not isinstance(item, str):
            raise DitgateUsageError(f"{what}: expected a string like '>=8.0' (or a list of them), got {item!r}")
        text = item.strip()
        range_match = re.fullmatch(r"([\w.]+)\s*-\s*([\w.]+)", text)
        if range_match and not text.startswith(("<", ">", "=", "!")):
            low, high = (parse_version(x, arch=arch) for x in range_match.groups())
            alternatives.append(((">=", low), ("<=", high)))
            continue
        clauses = []
        for part in text.split(","):
            match = _CLAUSE.match(part)
            if not match:
                raise DitgateUsageError(f"{what}: cannot parse {part.strip()!r} (examples: '>=8.0', '==8.6', '8.0-8.9')")
            op = match.group(1) or "=="
            clauses.append((op, parse_version(match.group(2), arch=arch)))
        alternatives.append(tuple(clauses))
    text = ", ".join(str(i) for i in items)
    spec = VersionSpec(tuple(alternatives), text)
    for index, clauses in enumerate(spec.alternatives):
        if not _satisfiable(clauses, arch=arch):
            which = f" (alternative {items[index]!r})" if len(items) > 1 else ""
            raise DitgateUsageError(f"{what}: {items[index]!r}{which} can never hold: no version satisfies every "
                                    "clause (a test marked with it would skip everywhere)")
    return spec


def _number_forms(item: float) -> str:
    """The string forms a bare compute-capability number could have meant."""
    try:
        version = parse_version(str(item), arch=True) if math.isfinite(item) else None
    except DitgateUsageError:
        version = None
    if not version or len(version) > 2:
        return "'>=8.0' (this or newer), '==8.6' (exactly), '8.0-8.9' (a range) or 'sm_86'"
    major, minor = version[0], version[1] if len(version) > 1 else 0
    return (f"'>={major}.{minor}' (this or newer), '=={major}.{minor}' (exactly), '{major}.{minor}-{major}.9' "
            f"(a range) or 'sm_{major}{minor}'")


def _satisfiable(clauses: tuple[tuple[str, Version], ...], *, arch: bool = False) -> bool:
    """Whether some version meets every clause (see :func:`jointly_satisfiable`)."""
    return jointly_satisfiable([VersionSpec((clauses,), "")], arch=arch)


def jointly_satisfiable(specs: list[VersionSpec], *, arch: bool = False, floor: Version = ()) -> bool:
    """Whether some version meets every one of ``specs`` (and is at least ``floor``). A compute capability is
    (major, single-digit minor), so every one is tried; for a tool version a conjunction of comparisons is an
    interval (minus a few points), so it is enough to try each bound, just above it, just below it, and the
    extremes."""
    if arch:
        return any(all(spec.matches((major, minor)) for spec in specs)
                   for major in range(256) for minor in range(10) if (major, minor) >= floor)
    probes: set[Version] = {(0,), (10**6,)}
    for spec in specs:
        for clauses in spec.alternatives:
            for _, bound in clauses:
                probes.add(bound)
                probes.add(bound + (1,))
                probes.add(bound + (0, 1))
                for i in range(len(bound)):
                    if bound[i] > 0:
                        probes.add(bound[:i] + (bound[i] - 1, 10**6))
                    probes.add(bound[:i] + (bound[i] + 1,))
    return any(probe >= floor and all(spec.matches(probe) for spec in specs) for probe in probes)


def _display_spec(spec: VersionSpec, prefix: str) -> str:
    """``sm>=8.9`` / ``sm in {8.6, 9.0}`` for skip reasons."""
    if len(spec.alternatives) == 1:
        return ",".join(f"{prefix}{op}{_fmt(v)}" for op, v in spec.alternatives[0])
    parts = [",".join(f"{op}{_fmt(v)}" for op, v in alt) for alt in spec.alternatives]
    return f"{prefix} in {{{'; '.join(parts)}}}"


@dataclass(frozen=True)
class Requirements:
    """Parsed ``requires_gpu`` keywords. ``None`` fields are not required."""

    cc: VersionSpec | None = None
    min_memory_gb: float | None = None
    bf16: bool = False
    fp8: bool = False
    tf32: bool = False
    sdpa: tuple[str, ...] = ()
    gpus: int = 1
    nvcc: VersionSpec | bool = False
    triton: VersionSpec | bool = False
    #: installed Python distributions: (name, version spec or None)
    packages: tuple[tuple[str, VersionSpec | None], ...] = ()
    why: str | None = None


KNOWN_KEYS = ("cc", "min_memory_gb", "bf16", "fp8", "tf32", "sdpa", "gpus", "nvcc", "triton", "packages", "why")
#: a distribution name as pip writes it, then an optional version spec that starts with its operator
_PACKAGE = re.compile(r"^\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*([<>=!].*)?$")


def _flag(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise DitgateUsageError(f"requires_gpu({key}=...) takes True or False, got {value!r}")
    return value


def _tool(key: str, value: Any) -> VersionSpec | bool:
    """``True``/``False``, or a version spec string (or list of them); a bare number is ambiguous
    (``triton=1``: a flag? version 1?) and refused."""
    if isinstance(value, bool):
        return value
    items = value if isinstance(value, (list, tuple)) else [value]
    if not items or not all(isinstance(item, str) for item in items):
        raise DitgateUsageError(f"requires_gpu({key}=...) takes True, False or a version spec string like "
                                f"'>=12.4' (or a list of them), got {value!r}")
    return parse_version_spec(value, what=f"requires_gpu({key}=...)")


def _packages(value: Any, what: str = "requires_gpu(packages=...)") -> tuple[tuple[str, VersionSpec | None], ...]:
    """``"quack-kernels"``, ``"quack-kernels>=0.6.5"`` or a list of them: distribution names (as installed by
    pip, not import names), each with an optional version spec."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items or not all(isinstance(item, str) for item in items):
        raise DitgateUsageError(f"{what} takes a distribution name like 'quack-kernels' or "
                                f"'quack-kernels>=0.6.5' (or a non-empty list of them), got {value!r}")
    parsed = []
    for item in items:
        match = _PACKAGE.match(item)
        if not match:
            raise DitgateUsageError(f"requires_gpu(packages=...): cannot parse {item!r} (examples: 'quack-kernels', "
                                    "'quack-kernels>=0.6.5', 'triton>=3.0,<4')")
        name, spec = match.groups()
        parsed.append((name, parse_version_spec(spec, what=f"requires_gpu(packages={item!r})") if spec else None))
    return tuple(parsed)


def _release(version: str) -> Version:
    """The leading release numbers of a version string: ``2.11.0+cu130`` -> (2, 11, 0), ``1.0rc1`` -> (1, 0)."""
    match = re.match(r"\d+(?:\.\d+)*", version.strip())
    return tuple(int(part) for part in match.group(0).split(".")) if match else (0,)


def parse_requirements(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Requirements:
    """Validate marker arguments; unknown keys and bad values raise :class:`DitgateUsageError`."""
    if args:
        raise DitgateUsageError(
            f"requires_gpu takes keyword requirements only (got positional {args!r}); known: {', '.join(KNOWN_KEYS)}"
        )
    unknown = sorted(set(kwargs) - set(KNOWN_KEYS))
    if unknown:
        raise DitgateUsageError(
            f"requires_gpu got unknown requirement(s) {', '.join(unknown)}; known: {', '.join(KNOWN_KEYS)}"
        )
    fields: dict[str, Any] = {}
    if "cc" in kwargs:
        fields["cc"] = parse_version_spec(kwargs["cc"], what="requires_gpu(cc=...)", arch=True)
    if "min_memory_gb" in kwargs:
        value = kwargs["min_memory_gb"]
        if not finite_number(value) or value <= 0:
            raise DitgateUsageError(f"requires_gpu(min_memory_gb=...) takes a finite positive number of GB, "
                                    f"got {value!r}")
        fields["min_memory_gb"] = float(value)
    for key in ("bf16", "fp8", "tf32"):
        if key in kwargs:
            fields[key] = _flag(key, kwargs[key])
    if "sdpa" in kwargs:
        raw = kwargs["sdpa"]
        if isinstance(raw, str):
            names = [raw]
        elif isinstance(raw, (list, tuple, set, frozenset)) and raw:
            names = list(raw)
        else:
            raise DitgateUsageError(f"requires_gpu(sdpa=...) takes a backend name or a non-empty list of them "
                                    f"({', '.join(SDPA_BACKENDS)}), got {raw!r}")
        backends = []
        for name in names:
            canonical = _SDPA_ALIASES.get(name.lower()) if isinstance(name, str) else None
            if canonical is None:
                raise DitgateUsageError(
                    f"requires_gpu(sdpa=...): unknown backend {name!r}; known: {', '.join(SDPA_BACKENDS)}"
                )
            backends.append(canonical)
        fields["sdpa"] = tuple(backends)
    if "gpus" in kwargs:
        value = kwargs["gpus"]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise DitgateUsageError(f"requires_gpu(gpus=...) takes an integer >= 1, got {value!r}")
        fields["gpus"] = value
    for key in ("nvcc", "triton"):
        if key in kwargs:
            fields[key] = _tool(key, kwargs[key])
    if "packages" in kwargs:
        fields["packages"] = _packages(kwargs["packages"])
    if "why" in kwargs:
        if not isinstance(kwargs["why"], str) or not kwargs["why"].strip():
            raise DitgateUsageError(f"requires_gpu(why=...) takes a non-empty string, got {kwargs['why']!r}")
        fields["why"] = kwargs["why"]
    return Requirements(**fields)


#: the compute capability a dtype flag needs, as detection decides it (``device.py``)
FLAG_MIN_CC: dict[str, Version] = {"bf16": (8, 0), "tf32": (8, 0), "fp8": (8, 9)}


def conflict(requirements: list[Requirements]) -> str | None:
    """Why no device can meet all of ``requirements`` at once (a test's stacked ``requires_gpu`` markers, or one
    marker's ``cc`` and dtype flags), or None. Such a test would skip on every device: a usage error, not a skip.
    Checked: the compute capability (every ``cc`` spec and the flags' minimums), ``nvcc`` and ``triton`` version
    specs, and the version specs given for one package."""
    ccs = [r.cc for r in requirements if r.cc is not None]
    flags = sorted({flag for r in requirements for flag in FLAG_MIN_CC if getattr(r, flag)})
    floor = max((FLAG_MIN_CC[flag] for flag in flags), default=())
    if (len(ccs) > 1 or (ccs and floor)) and not jointly_satisfiable(ccs, arch=True, floor=floor):
        stated = [f"cc={spec.text!r}" for spec in ccs] + [f"{flag}=True (sm>={_fmt(FLAG_MIN_CC[flag])})" for flag in flags]
        return f"no device meets {', '.join(stated)} together"
    for tool in ("nvcc", "triton"):
        specs = [getattr(r, tool) for r in requirements if isinstance(getattr(r, tool), VersionSpec)]
        if len(specs) > 1 and not jointly_satisfiable(specs):
            return f"no {tool} version meets {', '.join(repr(s.text) for s in specs)} together"
    by_package: dict[str, list[VersionSpec]] = {}
    for r in requirements:
        for name, spec in r.packages:
            if spec is not None:
                by_package.setdefault(name.lower().replace("_", "-"), []).append(spec)
    for name, specs in by_package.items():
        if len(specs) > 1 and not jointly_satisfiable(specs):
            return f"no version of {name} meets {', '.join(repr(s.text) for s in specs)} together"
    return None


def _gib(n: int | None) -> str:
    return "unknown" if n is None else f"{n / 2**30:.1f} GB"


def unmet(req: Requirements, device: DeviceInfo) -> list[str]:
    """Each requirement the device does not meet, worded for a skip reason (empty: all met)."""
    if not device.is_cuda:
        stated = describe(req)
        return [f"a CUDA GPU with {', '.join(stated)}" if stated else "a CUDA GPU"]
    missing: list[str] = []
    if req.cc is not None and (device.cc is None or not req.cc.matches(device.cc)):
        missing.append(_display_spec(req.cc, "sm"))
    if req.gpus > 1 and device.gpu_count < req.gpus:
        missing.append(f"{req.gpus} GPUs (found {device.gpu_count})")
    if req.min_memory_gb is not None:
        total = device.total_memory_bytes
        if total is None or total < req.min_memory_gb * 2**30:
            missing.append(f"{req.min_memory_gb:g} GB of device memory (has {_gib(total)})")
    if req.bf16 and not device.bf16:
        missing.append("bf16")
    if req.fp8 and not device.fp8:
        missing.append("fp8 (sm>=8.9)")
    if req.tf32 and not device.tf32:
        missing.append("tf32 (sm>=8.0)")
    for backend in req.sdpa:
        if not device.sdpa.get(backend, False):
            missing.append(f"the {backend} SDPA backend")
    for tool, spec in (("nvcc", req.nvcc), ("triton", req.triton)):
        if spec is False:
            continue
        version = getattr(device, tool)
        if version is None:
            missing.append(tool if spec is True else f"{tool} {spec.text}")
        elif isinstance(spec, VersionSpec) and not spec.matches(_release(version)):
            missing.append(f"{tool} {spec.text} (found {version})")
    return missing + _unmet_packages(req.packages)


def missing_packages(value: Any) -> list[str]:
    """``packages`` as ``requires_gpu(packages=...)`` takes them: each one not installed, or installed at a
    version outside its spec, worded as in skip reasons (``liger-kernel>=0.8 (found 0.7.1)``)."""
    return _unmet_packages(_packages(value))


def _unmet_packages(packages: tuple[tuple[str, VersionSpec | None], ...]) -> list[str]:
    missing = []
    for name, package_spec in packages:
        version = package_version(name)
        if version is None:
            missing.append(f"{_package_text(name, package_spec)} (not installed)")
        elif package_spec is not None and not package_spec.matches(_release(version)):
            missing.append(f"{_package_text(name, package_spec)} (found {version})")
    return missing


def _package_text(name: str, spec: VersionSpec | None) -> str:
    return name if spec is None else f"{name}{spec.text}"


def describe(req: Requirements) -> list[str]:
    """Every requirement ``req`` states, worded as in skip reasons (``sm>=8.0``, ``bf16``, ...)."""
    stated: list[str] = []
    if req.cc is not None:
        stated.append(_display_spec(req.cc, "sm"))
    if req.gpus > 1:
        stated.append(f"{req.gpus} GPUs")
    if req.min_memory_gb is not None:
        stated.append(f"{req.min_memory_gb:g} GB of device memory")
    stated += [flag for flag in ("bf16", "fp8", "tf32") if getattr(req, flag)]
    stated += [f"the {backend} SDPA backend" for backend in req.sdpa]
    for tool, spec in (("nvcc", req.nvcc), ("triton", req.triton)):
        if spec is not False:
            stated.append(tool if spec is True else f"{tool} {spec.text}")
    stated += [_package_text(name, spec) for name, spec in req.packages]
    return stated


def skip_reason(req: Requirements, device: DeviceInfo) -> str | None:
    """``needs sm>=8.9 for fp8; device is sm_86 (NVIDIA RTX A5500)``, or None when every requirement holds."""
    missing = unmet(req, device)
    if not missing:
        return None
    purpose = f" for {req.why}" if req.why else ""
    return f"needs {', '.join(missing)}{purpose}; device is {device.describe()}"
