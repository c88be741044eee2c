"""``ditgate doctor``: what this machine can gate, and what is missing for a full gate run."""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_ditgate.device_info import DeviceInfo
from pytest_ditgate.profiles import PROFILE_ENV

#: (import name, distribution, what it is for, required for a gate run)
DEPENDENCIES = (
    ("torch", "torch", "tensors, device detection, timing", True),
    ("safetensors", "safetensors", "golden files and dumps", True),
    ("filelock", "filelock", "ledgers and caches safe under xdist", True),
    ("pynvml", "nvidia-ml-py", "driver version, clocks and power in provenance", False),
    ("triton", "triton", "triton kernels and do_bench comparisons", False),
    ("pytest_benchmark", "pytest-benchmark", "--benchmark-json export", False),
    ("xdist", "pytest-xdist", "one worker per GPU", False),
    ("hypothesis", "hypothesis", "shape strategies for kernel checks", False),
    ("diffusers", "diffusers", "the DiT baseline pipeline", False),
    ("torchmetrics", "torchmetrics", "PSNR / SSIM quality metrics", False),
    ("lpips", "lpips", "LPIPS metric (needs local weights)", False),
    ("open_clip", "open-clip-torch", "CLIP score (needs local weights)", False),
    ("matplotlib", "matplotlib", "plots and error heat maps", False),
)


@dataclass
class DoctorReport:
    device: DeviceInfo
    real_device: DeviceInfo | None
    dependencies: dict[str, dict[str, Any]]
    workspaces: dict[str, str]
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: the project's settings (``doctor_project.ProjectReport``, a layer above: the command line adds it)
    project: Any = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def add_project(self, project: Any) -> None:
        """Add the project section: its problems and warnings become the report's."""
        self.project = project
        self.problems += project.problems
        self.warnings += project.warnings

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "device": self.device.to_dict(),
            "real_device": self.real_device.to_dict() if self.real_device else None,
            "profile": self.device.profile_name,
            "dependencies": self.dependencies,
            "workspaces": self.workspaces,
            "problems": self.problems,
            "warnings": self.warnings,
            "project": self.project.to_dict() if self.project else None,
        }


def check_dependencies(*, deep: bool = False) -> dict[str, dict[str, Any]]:
    """Import each required dependency (a broken install counts as missing, with its error); optional ones
    are only located (importing diffusers, open_clip or lpips takes seconds) unless ``deep``."""
    from pytest_ditgate.toolchain import package_version

    result: dict[str, dict[str, Any]] = {}
    for module, dist, purpose, required in DEPENDENCIES:
        entry: dict[str, Any] = {"purpose": purpose, "required": required, "version": package_version(dist)}
        entry.update(_importable(module) if required or deep else _locatable(module))
        result[dist] = entry
    return result


def _importable(module: str) -> dict[str, Any]:
    try:
        importlib.import_module(module)
    except Exception as exc:  # ImportError, or a broken binary extension
        return {"importable": False, "error": f"{type(exc).__name__}: {exc}"[:300], "checked": "imported"}
    return {"importable": True, "checked": "imported"}


def _locatable(module: str) -> dict[str, Any]:
    import importlib.util

    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError) as exc:
        return {"importable": False, "error": f"{type(exc).__name__}: {exc}"[:300], "checked": "located"}
    return {"importable": found, "checked": "located (not imported; --deep imports it)"}


def workspaces(artefact_dir: str | None = None) -> dict[str, str]:
    """The folders ditgate and its tools write to; the artefact folder is ``artefact_dir``, else the one the
    ``ditgate`` commands read (:func:`~pytest_ditgate.artefacts.command_artefact_dir`)."""
    from pytest_ditgate.artefacts import ENV, command_artefact_dir

    home = Path.home()
    spaces = {
        "artefacts (--ditgate-dir / DITGATE_DIR)": artefact_dir or str(command_artefact_dir()),
        "torch extensions (TORCH_EXTENSIONS_DIR)": os.environ.get("TORCH_EXTENSIONS_DIR", str(home / ".cache" / "torch_extensions")),
        "triton cache (TRITON_CACHE_DIR)": os.environ.get("TRITON_CACHE_DIR", str(home / ".triton" / "cache")),
    }
    for name, value in sorted(os.environ.items()):
        if name.startswith("DITGATE_") and name != ENV:
            spaces[f"${name}"] = value
    return spaces


def run_doctor(*, target: str | None = None, artefact_dir: str | None = None, deep: bool = False) -> DoctorReport:
    """The report; a target that names no profile or arch is a usage error (exit 4, as pytest's
    ``--ditgate-target``), raised before anything is probed."""
    from pytest_ditgate.device import current_device, real_device

    from pytest_ditgate.errors import DitgateUsageError

    if target:
        from pytest_ditgate.target import check_target_spec

        check_target_spec(target, source=f"--target {target}")
    profile_problem = None
    try:
        device = current_device()
    except DitgateUsageError as exc:  # a bad DITGATE_DEVICE_PROFILE: say so, and diagnose the real device
        profile_problem = f"{PROFILE_ENV}={os.environ.get(PROFILE_ENV)!r}: {exc}; showing the real device instead"
        device = real_device()
    real = real_device() if device.is_profile else None
    report = DoctorReport(device=device, real_device=real, dependencies=check_dependencies(deep=deep),
                          workspaces=workspaces(artefact_dir))
    if profile_problem:
        report.problems.append(profile_problem)
    for dist, entry in report.dependencies.items():
        if not entry["importable"]:
            text = f"{dist} is not importable ({entry.get('error', 'missing')}): needed for {entry['purpose']}"
            (report.problems if entry["required"] else report.warnings).append(text)
    if device.is_profile:
        report.warnings.append(f"device profile {device.profile_name} is in force ({PROFILE_ENV}); "
                               "capabilities below are the profile's, not the real device's")
    if not device.is_cuda:
        report.warnings.append(f"no CUDA device ({device.cpu_reason}): GPU-marked tests will skip; gates run on the CPU")
    elif not device.nvml:
        report.warnings.append("NVML unavailable: driver, clocks and power will be missing from provenance")
    if target:
        from pytest_ditgate.errors import DitgateUsageError
        from pytest_ditgate.target import evaluate_target

        mismatch = evaluate_target(target, real or device, profile=device.profile_name)
        if mismatch is not None:
            report.problems.append(mismatch.message)
    return report


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def render_text(report: DoctorReport) -> str:
    d = report.device
    lines = ["ditgate doctor", "", f"device      {d.header_line()}"]
    if report.real_device is not None:
        lines.append(f"real device {report.real_device.header_line()}")
    if d.is_cuda:
        l2 = f"{d.l2_bytes / 2**20:.0f} MB" if d.l2_bytes else "?"
        lines += [
            f"arch        {d.arch} (cc {d.cc[0]}.{d.cc[1]}), {d.sm_count} SMs, L2 {l2}, uuid {d.uuid or '?'}" if d.cc else "",
            f"memory      {(d.total_memory_bytes or 0) / 2**30:.1f} GiB total, "
            + (f"{d.free_memory_bytes / 2**30:.1f} GiB free" if d.free_memory_bytes else "free unknown"),
            f"gpus        {d.gpu_count}",
        ]
    lines += [
        f"dtypes      bf16 {_yes(d.bf16)}, fp8 {_yes(d.fp8)}, tf32 {_yes(d.tf32)}",
        "sdpa        " + ", ".join(f"{k} {_yes(v)}" for k, v in sorted(d.sdpa.items())),
        f"toolchain   torch {d.torch or '-'}, CUDA {d.cuda_runtime or '-'}, driver {d.driver or '-'}, "
        f"triton {d.triton or '-'}, nvcc {d.nvcc or '-'}",
        "",
        "dependencies:",
    ]
    for dist, entry in report.dependencies.items():
        state = f"ok {entry['version'] or ''}".strip() if entry["importable"] else "MISSING"
        need = "required" if entry["required"] else "optional"
        lines.append(f"  {dist:<18} {state:<22} {need}: {entry['purpose']}")
    lines += ["", "workspaces:"] + [f"  {name}: {path}" for name, path in report.workspaces.items()]
    if report.project is not None:
        project = report.project
        lines += ["", f"project     {project.root}" + ("" if project.pyproject else " (no pyproject.toml: defaults)")]
        lines += [f"  {line}" for line in project.checked]
    if report.warnings:
        lines += ["", "warnings:"] + [f"  - {w}" for w in report.warnings]
    if report.problems:
        lines += ["", "PROBLEMS (a full gate run needs these fixed):"] + [f"  - {p}" for p in report.problems]
    lines += ["", "status: " + ("ok" if report.ok else "NOT READY")]
    return "\n".join(lines)
