"""``--ditgate-target``: the device a runner must have; a mismatch fails the session at start.

A CI runner that lost its GPU must not go green by skipping every GPU test.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_ditgate.device import DeviceInfo
from pytest_ditgate.errors import DitgateUsageError, ProfileError


@dataclass(frozen=True)
class TargetMismatch:
    message: str


def _is_arch(text: str) -> bool:
    return text.startswith("sm_") and text[3:].isdigit() or text == "cpu"


def evaluate_target(target: str, device: DeviceInfo) -> TargetMismatch | None:
    """None when ``device`` is the declared target (a profile name, profile file or ``sm_XY``)."""
    from pytest_ditgate.profiles import mismatches, read_profile

    target = target.strip()
    if _is_arch(target.lower()):
        wanted_arch, wanted_name = target.lower(), None
    else:
        try:
            data = read_profile(target)
        except ProfileError as exc:
            raise DitgateUsageError(f"--ditgate-target={target}: {exc}") from None
        wanted_arch, wanted_name = data["arch"], data.get("match_name")
    problems = mismatches(wanted_arch, wanted_name, device.name, device.arch)
    if not problems:
        return None
    where = " (from a device profile)" if device.is_profile else ""
    return TargetMismatch(
        f"ditgate target mismatch: this run declares --ditgate-target={target}, but the device{where} is "
        f"{device.describe()}: {'; '.join(problems)}. Refusing to run: on a declared target runner a missing "
        "or different GPU is an error, not a reason to skip."
    )
