"""Named device profiles: JSON descriptions of a device that replace detection for skip decisions.

A profile lets a CPU-only machine answer "what would this test do on an RTX A5500?". Shipped profiles
live in ``pytest_ditgate/profiles/``; a user profile is any JSON file with the same fields.
"""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from pathlib import Path
from typing import Any

from pytest_ditgate import toolchain
from pytest_ditgate.errors import ProfileError

REQUIRED_FIELDS = ("name", "arch")


def shipped_profiles() -> list[str]:
    """Names of the profiles shipped with the plugin."""
    folder = resources.files("pytest_ditgate") / "profiles"
    return sorted(entry.name[:-5] for entry in folder.iterdir() if entry.name.endswith(".json"))


def read_profile(spec: str) -> dict[str, Any]:
    """Raw profile data for a shipped name or a JSON file path."""
    looks_like_path = spec.endswith(".json") or "/" in spec or "\\" in spec
    if looks_like_path:
        path = Path(spec).expanduser()
        if not path.is_file():
            raise ProfileError(f"device profile file {spec!r} does not exist")
        text = path.read_text(encoding="utf-8")
        origin = str(path)
    else:
        entry = resources.files("pytest_ditgate") / "profiles" / f"{spec}.json"
        if not entry.is_file():
            raise ProfileError(
                f"unknown device profile {spec!r}; shipped profiles: {', '.join(shipped_profiles())} "
                "(or give a path to a JSON file)"
            )
        text = entry.read_text(encoding="utf-8")
        origin = spec
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"device profile {origin}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ProfileError(f"device profile {origin}: expected a JSON object")
    missing = [name for name in REQUIRED_FIELDS if name not in data]
    if missing:
        raise ProfileError(f"device profile {origin}: missing field(s) {', '.join(missing)}")
    arch = data["arch"]
    if arch != "cpu" and not (isinstance(arch, str) and arch.startswith("sm_") and arch[3:].isdigit()):
        raise ProfileError(f"device profile {origin}: arch must be 'cpu' or like 'sm_86', got {arch!r}")
    if arch != "cpu" and data.get("cc") is None:
        digits = arch[3:]
        data["cc"] = [int(digits[:-1]), int(digits[-1])]
    data.setdefault("profile", Path(origin).stem if looks_like_path else spec)
    data["_origin"] = origin
    return data


def load_profile(spec: str):
    """A :class:`~pytest_ditgate.device.DeviceInfo` described by profile ``spec`` (name or path).

    Fields the profile leaves out that describe the host rather than the GPU (torch, nvcc and triton
    versions) are filled from the real host, so toolchain requirements stay honest.
    """
    from pytest_ditgate.device import DeviceInfo

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
