"""Device detection: a machine with no driver, a CPU-only torch or no NVML is a normal CPU DeviceInfo."""

from __future__ import annotations

import sys
import types

import pytest

from pytest_ditgate import device as device_mod
from pytest_ditgate.device import DeviceInfo, detect_device


def test_this_machine_yields_a_device_info() -> None:
    info = detect_device()
    assert isinstance(info, DeviceInfo)
    assert info.source == "detected"
    if not info.is_cuda:
        assert info.arch == "cpu" and info.cpu_reason


def test_cuda_probe_raising_runtime_error_means_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.version, "cuda", "13.0")

    def broken() -> bool:
        raise RuntimeError("Found no NVIDIA driver on your system")

    monkeypatch.setattr(torch.cuda, "is_available", broken)
    info = detect_device()
    assert info.arch == "cpu" and "Found no NVIDIA driver" in info.cpu_reason


def test_cuda_probe_raising_assertion_error_means_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: (_ for _ in ()).throw(AssertionError("Torch not compiled with CUDA enabled")))
    info = detect_device()
    assert info.arch == "cpu" and "not compiled with CUDA" in info.cpu_reason


def test_cpu_only_torch_build(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.version, "cuda", None)
    assert detect_device().cpu_reason == "CPU-only torch build"


def test_nvml_library_missing_is_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    class NVMLError_LibraryNotFound(Exception):
        pass

    fake = types.SimpleNamespace(nvmlInit=lambda: (_ for _ in ()).throw(NVMLError_LibraryNotFound("libnvidia-ml.so.1 not found")))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert device_mod._nvml_details(0) == {}


def test_device_info_round_trips_through_json() -> None:
    from pytest_ditgate.profiles import load_profile

    info = load_profile("h200")
    again = DeviceInfo.from_dict(info.to_dict())
    assert again == info


def test_profile_errors_are_clear(tmp_path) -> None:
    from pytest_ditgate.errors import ProfileError
    from pytest_ditgate.profiles import load_profile

    with pytest.raises(ProfileError, match="unknown device profile 'nope'"):
        load_profile("nope")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ProfileError, match="not valid JSON"):
        load_profile(str(bad))
    bad.write_text('{"name": "x"}')
    with pytest.raises(ProfileError, match="missing field"):
        load_profile(str(bad))
    bad.write_text('{"name": "x", "arch": "ampere"}')
    with pytest.raises(ProfileError, match="arch must be"):
        load_profile(str(bad))
    with pytest.raises(ProfileError, match="is a folder; give a profile's JSON file"):
        load_profile(str(tmp_path) + "/")


def test_device_arch_names_the_device_without_probing_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The judge names the device while its child uses it: no memory query, no backend probe, no tool call."""
    torch = pytest.importorskip("torch")
    from pytest_ditgate.device import device_arch

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))

    def touched(*args, **kwargs):
        raise AssertionError("device_arch must not create a context or probe the device")

    monkeypatch.setattr(torch.cuda, "mem_get_info", touched)
    monkeypatch.setattr(device_mod, "probe_sdpa_backends", touched)
    monkeypatch.setattr(device_mod.toolchain, "nvcc_version", touched)
    assert device_arch() == "sm_90"


def test_device_arch_is_cpu_where_detection_says_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from pytest_ditgate.device import device_arch

    assert device_arch() == detect_device().arch  # this machine, unpatched
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: (_ for _ in ()).throw(RuntimeError("no driver")))
    assert device_arch() == "cpu"
    monkeypatch.setattr(torch.version, "cuda", None)
    assert device_arch() == "cpu"
