"""Named device profiles: JSON descriptions of a device that replace detection for skip decisions.

A profile lets a CPU-only machine answer "what would this test do on an RTX A5500?". Shipped profiles
live in ``pytest_ditgate/profiles/``; a user profile is any JSON file with the same fields.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
from importlib import resources
from pathlib import Path
from typing import Any

from pytest_ditgate import toolchain
from pytest_ditgate.arguments import clip
from pytest_ditgate.device_info import SDPA_BACKENDS, DeviceInfo, arch_label
from pytest_ditgate.dtypes import PEAK_KEYS
from pytest_ditgate.errors import ProfileError
from pytest_ditgate.fsutil import CorruptFile, decode_json_object
from pytest_ditgate.numbers import finite_number

#: names the profile that replaces detection (a shipped name or a JSON file)
PROFILE_ENV = "DITGATE_DEVICE_PROFILE"
REQUIRED_FIELDS = ("name", "arch")


def shipped_profiles() -> list[str]:
    """Names of the profiles shipped with the plugin."""
    folder = resources.files("pytest_ditgate") / "profiles"
    return sorted(entry.name[:-5] for entry in folder.iterdir() if entry.name.endswith(".json"))


def read_profile(spec: str) -> dict[str, Any]:
    """Raw profile data for a shipped name or a JSON file path, every field validated.

    Any problem is a :class:`ProfileError` naming the profile and the field, with the allowed values.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ProfileError(f"device profile name {spec!r} is empty; shipped profiles: {', '.join(shipped_profiles())} "
                           "(or give a path to a JSON file)")
    looks_like_path = spec.endswith(".json") or "/" in spec or "\\" in spec
    if looks_like_path:
        path = Path(spec).expanduser()
        if path.is_dir():
            raise ProfileError(f"device profile file {spec!r} is a folder; give a profile's JSON file (shipped "
                               f"profiles: {', '.join(shipped_profiles())})")
        if not path.is_file():
            raise ProfileError(f"device profile file {spec!r} does not exist")
        origin = str(path)
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ProfileError(f"device profile {origin}: cannot read ({exc.strerror or exc})") from None
    else:
        entry = resources.files("pytest_ditgate") / "profiles" / f"{spec}.json"
        if not _plain_name(spec) or not entry.is_file():
            raise ProfileError(
                f"unknown device profile {spec!r}; shipped profiles: {', '.join(shipped_profiles())} "
                "(or give a path to a JSON file)"
            )
        raw = entry.read_bytes()
        origin = spec
    try:
        data = decode_json_object(raw, f"device profile {origin}")
    except CorruptFile as exc:
        raise ProfileError(str(exc)) from None
    validate_profile(data, origin)
    arch = data["arch"]
    if arch != "cpu" and data.get("cc") is None:
        digits = arch[3:]
        data["cc"] = [int(digits[:-1]), int(digits[-1])]
    data.setdefault("profile", Path(origin).stem if looks_like_path else spec)
    data["_origin"] = origin
    return data


def _plain_name(spec: str) -> bool:
    return spec.replace("_", "").replace("-", "").replace(".", "").isalnum() and not spec.startswith(".")


#: field -> (what it must be, check); ``None`` is allowed where the check says so
_STR = ("a string", lambda v: isinstance(v, str))
_OPT_STR = ("a string or null", lambda v: v is None or isinstance(v, str))
_BOOL = ("true or false", lambda v: isinstance(v, bool))
_OPT_COUNT = ("a positive integer or null", lambda v: v is None or (type(v) is int and v > 0))
_OPT_INDEX = ("an integer >= 0 or null", lambda v: v is None or (type(v) is int and v >= 0))
FIELDS: dict[str, tuple[str, Any]] = {
    "name": _STR, "arch": ("'cpu' or like 'sm_86'", None), "cc": ("[major, minor] integers or null", None),
    "profile": _STR, "description": _OPT_STR, "match_name": _OPT_STR, "uuid": _OPT_STR,
    "sm_count": _OPT_COUNT, "l2_bytes": _OPT_COUNT, "total_memory_bytes": _OPT_COUNT,
    "free_memory_bytes": _OPT_INDEX, "driver": _OPT_STR, "cuda_runtime": _OPT_STR, "torch": _OPT_STR,
    "triton": _OPT_STR, "nvcc": _OPT_STR, "bf16": _BOOL, "fp8": _BOOL, "tf32": _BOOL, "nvml": _BOOL,
    "sdpa": ("an object of backend -> true/false", None), "gpu_count": ("an integer >= 0", lambda v: type(v) is int and v >= 0),
    "index": _OPT_INDEX, "cpu_reason": _OPT_STR,
    "peaks": ("an object with source (text), tflops (dtype -> number) and/or gbps (number)", None),
}


def validate_profile(data: dict[str, Any], origin: str) -> None:
    """Check every field of a profile; unknown fields and wrong types raise one :class:`ProfileError` that
    names every problem found (not only the first)."""
    where = f"device profile {origin}"
    problems = profile_problems(data)
    if len(problems) == 1:
        raise ProfileError(f"{where}: {problems[0]}")
    if problems:
        raise ProfileError(f"{where}: {len(problems)} problems: " + "; ".join(problems))


def profile_problems(data: dict[str, Any]) -> list[str]:
    """Every problem of a profile's fields, each naming the field and what it must be (empty: valid)."""
    problems = []
    missing = [name for name in REQUIRED_FIELDS if name not in data]
    if missing:
        problems.append(f"missing field(s) {', '.join(missing)} (required: {', '.join(REQUIRED_FIELDS)})")
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        problems.append(f"unknown field(s) {', '.join(unknown)}; allowed: {', '.join(FIELDS)}")
    for name, (allowed, check) in FIELDS.items():
        if name in data and check is not None and not check(data[name]):
            problems.append(f"field {name!r} must be {allowed}, got {clip(repr(data[name]), 80)}")
    arch = data.get("arch", "cpu")
    arch_ok = arch == "cpu" or (isinstance(arch, str) and arch.startswith("sm_") and arch[3:].isdigit()
                                and len(arch) >= 5)
    if not arch_ok:
        problems.append(f"arch must be 'cpu' or like 'sm_86', got {clip(repr(arch), 80)}")
    cc = data.get("cc")
    if cc is not None:
        if not (isinstance(cc, list) and len(cc) == 2 and all(type(x) is int and x >= 0 for x in cc)):
            problems.append(f"field 'cc' must be [major, minor] integers (like [8, 6]) or null, got "
                            f"{clip(repr(cc), 80)}")
        elif arch_ok and arch != "cpu" and arch_label(cc) != arch:
            problems.append(f"cc {cc!r} does not match arch {arch!r}")
    if "peaks" in data:
        try:
            _validate_peaks(data["peaks"], "")
        except ProfileError as exc:
            problems.append(str(exc).removeprefix(": "))
    sdpa = data.get("sdpa")
    if sdpa is not None:
        if not isinstance(sdpa, dict):
            problems.append(f"field 'sdpa' must be an object of backend -> true/false, got {clip(repr(sdpa), 80)}")
        else:
            for backend, works in sdpa.items():
                if backend not in SDPA_BACKENDS or not isinstance(works, bool):
                    problems.append(f"sdpa.{backend} = {works!r}: backends are {', '.join(SDPA_BACKENDS)}, "
                                    "each true or false")
    return problems


def _positive(value: Any) -> bool:
    return finite_number(value) and value > 0


def _validate_peaks(peaks: Any, where: str) -> None:
    """``peaks``: measured rates of this device (never datasheet numbers), with where they were measured."""
    allowed = "an object with source (text), tflops (dtype -> number) and/or gbps (number)"
    if not isinstance(peaks, dict) or not peaks.keys() <= {"source", "tflops", "gbps"}:
        raise ProfileError(f"{where}: field 'peaks' must be {allowed}, got {peaks!r}")
    if not isinstance(peaks.get("source"), str) or not peaks["source"].strip():
        raise ProfileError(f"{where}: peaks.source must say where the peaks were measured")
    if "gbps" in peaks and not _positive(peaks["gbps"]):
        raise ProfileError(f"{where}: peaks.gbps must be a positive number, got {peaks['gbps']!r}")
    tflops = peaks.get("tflops", {})
    if not isinstance(tflops, dict):
        raise ProfileError(f"{where}: peaks.tflops must be an object of dtype -> number, got {tflops!r}")
    for dtype, value in tflops.items():
        if dtype not in PEAK_KEYS or not _positive(value):
            raise ProfileError(f"{where}: peaks.tflops.{dtype} = {value!r}: dtypes are {', '.join(PEAK_KEYS)}, "
                               "each a positive number")


def mismatches(wanted_arch: str, wanted_name: str | None, name: str, arch: str) -> list[str]:
    """How the device ``name``/``arch`` differs from a profile's ``arch`` and ``match_name`` (a name that
    contains ``match_name``, any case, matches; no ``match_name``: any name); empty when it is that device."""
    problems = []
    if arch != wanted_arch:
        problems.append(f"arch {arch}, not {wanted_arch}")
    if wanted_name and wanted_name.lower() not in name.lower():
        problems.append(f"name {name!r} does not contain {wanted_name!r}")
    return problems


def _describes(data: dict[str, Any], name: str, arch: str) -> bool:
    """Peaks are only lent to the device a profile names: its arch and a ``match_name`` (required here)."""
    return bool(data.get("match_name")) and not mismatches(data.get("arch"), data["match_name"], name, arch)


def peaks_for(name: str, arch: str, profile: str | None = None) -> tuple[dict[str, Any] | None, str]:
    """The measured peaks of the device ``name``/``arch`` and a note on where they come from.

    ``profile`` (default: the one ``DITGATE_DEVICE_PROFILE`` names) is asked first, then the shipped ones;
    a profile counts only when its arch and ``match_name`` describe this device."""
    profile = profile or os.environ.get(PROFILE_ENV)
    candidates = [(profile, read_profile)] if profile else []
    candidates += [(shipped, _read_shipped) for shipped in shipped_profiles()]
    for spec, read in candidates:
        try:
            data = read(spec)
        except ProfileError:
            continue
        if _describes(data, name, arch) and data.get("peaks"):
            peaks = dict(copy.deepcopy(data["peaks"]), profile=data["profile"])  # never the cached one's dicts
            return peaks, f"peaks from device profile {data['profile']}: {peaks['source']}"
    return None, (f"no device profile with measured peaks describes {name} ({arch}): rates are absolute "
                  "(add a 'peaks' object to a device profile to compare with this device's peaks)")


@functools.lru_cache(maxsize=None)
def _read_shipped(name: str) -> dict[str, Any]:
    """A shipped profile, read once per process (package data does not change under a run; a user's file
    may, so it is read every time). Callers copy what they keep."""
    return read_profile(name)


def load_profile(spec: str) -> DeviceInfo:
    """A :class:`~pytest_ditgate.device_info.DeviceInfo` described by profile ``spec`` (name or path).

    Fields the profile leaves out that describe the host rather than the GPU (torch, nvcc and triton
    versions) are filled from the real host, so toolchain requirements stay honest.
    """
    data = read_profile(spec)
    info = DeviceInfo.from_dict(data)
    host: dict[str, Any] = {}
    if "torch" not in data:
        host["torch"] = toolchain.package_version("torch")
    if "nvcc" not in data:
        host["nvcc"] = toolchain.nvcc_version()
    if "triton" not in data:
        host["triton"] = toolchain.triton_version()
    gpu_count = data.get("gpu_count", 1 if info.is_cuda else 0)
    return dataclasses.replace(info, source=f"profile:{data['_origin']}", gpu_count=gpu_count, **host)
