"""What device the tests run on: a :class:`~pytest_ditgate.device_info.DeviceInfo` from torch and NVML, or
from the named profile (``profiles.py``) that ``DITGATE_DEVICE_PROFILE`` puts in force.

Detection is lazy and cached: nothing here imports torch until :func:`detect_device` is called, and a
machine without a driver, with a CPU-only torch or without NVML yields a CPU ``DeviceInfo`` rather than
an exception.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from pytest_ditgate import toolchain
from pytest_ditgate.device_info import SDPA_BACKENDS, DeviceInfo, arch_label


def _cpu_info(reason: str, torch_version: str | None) -> DeviceInfo:
    return DeviceInfo(
        name="cpu",
        arch="cpu",
        cpu_reason=reason,
        torch=torch_version,
        triton=toolchain.triton_version(),
        nvcc=toolchain.nvcc_version(),
        bf16=True,  # torch runs bf16 on the CPU (slowly), so a bf16 test is valid there
        sdpa={"flash": False, "efficient": False, "cudnn": False, "math": torch_version is not None},
    )


def probe_sdpa_backends(device: Any, dtype: Any) -> dict[str, bool]:
    """Run a tiny attention call through each SDPA backend; a backend works only if its call succeeds."""
    import torch
    import torch.nn.functional as F

    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # torch < 2.3
        return {name: False for name in SDPA_BACKENDS}

    members = {
        "flash": "FLASH_ATTENTION",
        "efficient": "EFFICIENT_ATTENTION",
        "cudnn": "CUDNN_ATTENTION",
        "math": "MATH",
    }
    result: dict[str, bool] = {}
    q = torch.randn(1, 2, 16, 64, device=device, dtype=dtype)
    for name, member in members.items():
        backend = getattr(SDPBackend, member, None)
        if backend is None:
            result[name] = False
            continue
        try:
            with sdpa_kernel([backend]):
                out = F.scaled_dot_product_attention(q, q, q)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            result[name] = bool(torch.isfinite(out).all())
        except (RuntimeError, ValueError, NotImplementedError):
            result[name] = False
    return result


def _nvml_details(index: int) -> dict[str, Any]:
    """Driver, UUID and memory from NVML; empty when NVML is missing or fails (a normal case)."""
    try:
        import pynvml
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return {}
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        details: dict[str, Any] = {"nvml": True}
        driver = pynvml.nvmlSystemGetDriverVersion()
        details["driver"] = driver.decode() if isinstance(driver, bytes) else str(driver)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        details["uuid"] = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        details["free_memory_bytes"] = int(memory.free)
        return details
    except Exception:
        return {}
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def detect_device(index: int | None = None, *, probe_sdpa: bool = True) -> DeviceInfo:
    """Detect the device from torch (and NVML when present). Never raises for a missing GPU."""
    try:
        import torch
    except ImportError:
        return _cpu_info("torch is not installed", None)
    torch_version = torch.__version__
    if torch.version.cuda is None:
        return _cpu_info("CPU-only torch build", torch_version)
    try:
        available = torch.cuda.is_available()
        count = torch.cuda.device_count() if available else 0
    except (RuntimeError, AssertionError) as exc:
        return _cpu_info(f"CUDA unusable: {exc}", torch_version)
    if not available or count == 0:
        return _cpu_info("no CUDA device or driver", torch_version)
    if index is None:
        index = torch.cuda.current_device()
    try:
        props = torch.cuda.get_device_properties(index)
        free, total = torch.cuda.mem_get_info(index)
        bf16 = bool(torch.cuda.is_bf16_supported())
    except (RuntimeError, AssertionError) as exc:
        return _cpu_info(f"CUDA unusable: {exc}", torch_version)
    cc = (int(props.major), int(props.minor))
    details: dict[str, Any] = {
        "uuid": str(getattr(props, "uuid", "")) or None,
        "free_memory_bytes": int(free),
        "driver": None,
    }
    details.update(_nvml_details(index))
    sdpa: dict[str, bool] = {}
    if probe_sdpa:
        dtype = torch.bfloat16 if bf16 else torch.float16
        sdpa = probe_sdpa_backends(torch.device("cuda", index), dtype)
    return DeviceInfo(
        name=str(props.name),
        arch=arch_label(cc),
        cc=cc,
        sm_count=int(props.multi_processor_count),
        l2_bytes=int(getattr(props, "L2_cache_size", 0)) or None,
        total_memory_bytes=int(total),
        cuda_runtime=torch.version.cuda,
        torch=torch_version,
        triton=toolchain.triton_version(),
        nvcc=toolchain.nvcc_version(),
        bf16=bf16,
        fp8=cc >= (8, 9),
        tf32=cc >= (8, 0),
        sdpa=sdpa,
        gpu_count=count,
        index=index,
        **details,
    )


@functools.lru_cache(maxsize=8)
def _cached_device(profile: str | None) -> DeviceInfo:
    if profile:
        from pytest_ditgate.profiles import load_profile

        return load_profile(profile)
    return detect_device()


def current_device() -> DeviceInfo:
    """The device that skip decisions use: the profile named by ``DITGATE_DEVICE_PROFILE``, else detection."""
    from pytest_ditgate.profiles import PROFILE_ENV

    return _cached_device(os.environ.get(PROFILE_ENV) or None)


def real_device() -> DeviceInfo:
    """The real device, ignoring any profile (for provenance of measurements)."""
    return _cached_device(None)


def device_arch() -> str:
    """The arch label of the current device (``sm_90``, or ``cpu``), as :func:`detect_device` names it, but
    with no backend probe, no memory query and no tool call: for a process that only names the device
    while another one works on it (the judge, while its child runs the lane's tests)."""
    try:
        import torch
    except ImportError:
        return "cpu"
    if torch.version.cuda is None:
        return "cpu"
    try:
        if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
            return "cpu"
        cc = torch.cuda.get_device_capability(torch.cuda.current_device())
    except (RuntimeError, AssertionError):
        return "cpu"
    return arch_label(cc)


def clear_cache() -> None:
    _cached_device.cache_clear()
