"""Clock, power and temperature snapshots from NVML, taken at the start and end of a measurement.

A GPU that throttles during a run measures slower; recording SM and memory clocks, power and
temperature next to the samples says so. Every function returns None when NVML is missing or fails.
"""

from __future__ import annotations

import functools
import time
from typing import Any


@functools.lru_cache(maxsize=1)
def _nvml() -> Any:
    """The initialised ``pynvml`` module, or None (initialised once per process, never shut down mid-run)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    return pynvml


def _query(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:
        return None


def snapshot(index: int | None, uuid: str | None = None) -> dict[str, Any] | None:
    """SM/memory clocks (MHz), power (W), temperature (C) and clock-event reasons of one GPU, or None.

    The GPU is found by ``uuid`` when known (CUDA and NVML number devices differently under
    ``CUDA_VISIBLE_DEVICES``), else by ``index``.
    """
    nvml = _nvml()
    if nvml is None or (index is None and not uuid):
        return None
    handle = _query(nvml.nvmlDeviceGetHandleByUUID, uuid) if uuid else None
    if handle is None and index is not None:
        handle = _query(nvml.nvmlDeviceGetHandleByIndex, index)
    if handle is None:
        return None
    power_mw = _query(nvml.nvmlDeviceGetPowerUsage, handle)
    reasons = _query(getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                     or nvml.nvmlDeviceGetCurrentClocksThrottleReasons, handle)
    return {
        "time": time.time(),
        "sm_clock_mhz": _query(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM),
        "mem_clock_mhz": _query(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_MEM),
        "power_w": None if power_mw is None else power_mw / 1000.0,
        "temperature_c": _query(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU),
        "clock_event_reasons": reasons,
    }
