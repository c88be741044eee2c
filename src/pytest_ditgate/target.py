"""``--ditgate-target``: the device a runner must have; a mismatch fails the session at start.

A CI runner that lost its GPU must not go green by skipping every GPU test.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_ditgate.device_info import DeviceInfo
from pytest_ditgate.errors import DitgateUsageError, ProfileError


@dataclass(frozen=True)
class TargetMismatch:
    message: str


def _is_arch(text: str) -> bool:
    return text.startswith("sm_") and text[3:].isdigit() or text == "cpu"


def check_target_spec(target: str, *, source: str | None = None) -> tuple[str, str | None]:
    """``(arch, match_name)`` of a target spec (a profile name, profile file or ``sm_XY``); a spec that names
    none is a DitgateUsageError listing the shipped profiles."""
    from pytest_ditgate.profiles import read_profile

    target = target.strip()
    if _is_arch(target.lower()):
        return target.lower(), None
    try:
        data = read_profile(target)
    except ProfileError as exc:
        raise DitgateUsageError(f"{source or f'--ditgate-target={target}'}: {exc}") from None
    return data["arch"], data.get("match_name")


def evaluate_target(target: str, device: DeviceInfo, *, profile: str | None = None) -> TargetMismatch | None:
    """None when ``device`` (the machine's real device, never a profile's) is the declared target (a profile
    name, profile file or ``sm_XY``). ``profile``: the device profile in force for skip decisions, named in the
    message (it changes what is skipped, not the hardware the target asks for)."""
    from pytest_ditgate.profiles import mismatches

    target = target.strip()
    wanted_arch, wanted_name = check_target_spec(target)
    problems = mismatches(wanted_arch, wanted_name, device.name, device.arch)
    if not problems:
        return None
    note = (f" (the device profile {profile!r} in force changes what is skipped, not the hardware: a target is "
            "checked against the machine)") if profile else ""
    return TargetMismatch(
        f"ditgate target mismatch: this run declares --ditgate-target={target}, but this machine's device is "
        f"{device.describe()}: {'; '.join(problems)}{note}. Refusing to run: on a declared target runner a missing "
        "or different GPU is an error, not a reason to skip."
    )
