"""What a device is: :class:`DeviceInfo` (identity and capabilities), the arch label of a compute capability,
and the SDPA backend names. Pure data, torch-free: detection (``device.py``), named profiles
(``profiles.py``), ``requires_gpu`` requirements and targets all describe a device with it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math")


@dataclass(frozen=True)
class DeviceInfo:
    """Identity and capabilities of one device (the first visible GPU, or the CPU)."""

    name: str
    arch: str  # "sm_86", or "cpu"
    cc: tuple[int, int] | None = None
    uuid: str | None = None
    sm_count: int | None = None
    l2_bytes: int | None = None
    total_memory_bytes: int | None = None
    free_memory_bytes: int | None = None
    driver: str | None = None
    cuda_runtime: str | None = None
    torch: str | None = None
    triton: str | None = None
    nvcc: str | None = None
    bf16: bool = False
    fp8: bool = False
    tf32: bool = False
    sdpa: dict[str, bool] = field(default_factory=dict)
    gpu_count: int = 0
    index: int | None = None
    #: "detected", or "profile:<name or path>" when a profile replaces detection
    source: str = "detected"
    #: why there is no CUDA device (only for CPU infos)
    cpu_reason: str | None = None
    nvml: bool = False

    @property
    def is_cuda(self) -> bool:
        return self.arch != "cpu"

    @property
    def is_profile(self) -> bool:
        return self.source.startswith("profile:")

    @property
    def profile_name(self) -> str | None:
        return self.source.split(":", 1)[1] if self.is_profile else None

    def describe(self) -> str:
        """``sm_86 (NVIDIA RTX A5500)`` or ``cpu (no CUDA device: ...)``: used in skip reasons."""
        if self.is_cuda:
            return f"{self.arch} ({self.name})"
        return f"cpu ({self.cpu_reason or self.name})"

    def header_line(self) -> str:
        """One line for pytest's header and logs."""
        if self.is_cuda:
            mem = f", {self.total_memory_bytes / 2**30:.0f} GiB" if self.total_memory_bytes else ""
            text = (f"{self.name} {self.arch}{mem}, driver {self.driver or '?'}, torch {self.torch or '?'}, "
                    f"CUDA {self.cuda_runtime or '?'}")
            if self.gpu_count > 1:
                text += f", {self.gpu_count} GPUs"
        else:
            text = f"cpu ({self.cpu_reason or 'no CUDA device'}), torch {self.torch or 'not installed'}"
        if self.is_profile:
            text += f" [PROFILE {self.profile_name} in force: skip decisions use the profile, not the real device]"
        return text

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["cc"] = list(self.cc) if self.cc else None
        data["is_cuda"] = self.is_cuda
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "DeviceInfo":
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        if kwargs.get("cc") is not None:
            kwargs["cc"] = tuple(int(x) for x in kwargs["cc"])
        if kwargs.get("sdpa") is not None:
            kwargs["sdpa"] = {str(k): bool(v) for k, v in dict(kwargs["sdpa"]).items()}
        return cls(**kwargs)


def arch_label(cc: tuple[int, int]) -> str:
    """``sm_90`` for compute capability (9, 0): the arch key of goldens, ledgers and lanes."""
    return f"sm_{int(cc[0])}{int(cc[1])}"
