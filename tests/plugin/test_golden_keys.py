"""The device-key fallback chain (pure)."""

from __future__ import annotations

import pytest

from pytest_ditgate.golden.keys import (CPU_SCALE, FAMILY_SCALE, device_of, fallback_chain, family, is_machine_key,
                                       machine_key, validate_key)


def test_chain_order_exact_family_nearest_first_then_cpu() -> None:
    chain = fallback_chain("sm_86", {"sm_80", "sm_89", "sm_90", "cpu", "sm_86"})
    assert [(s.key, s.tolerance_scale, s.rule) for s in chain] == [
        ("sm_86", 1.0, "exact"), ("sm_89", FAMILY_SCALE, "family sm_8x"), ("sm_80", FAMILY_SCALE, "family sm_8x"),
        ("cpu", CPU_SCALE, "cpu")]
    assert [s.fallback for s in chain] == [False, True, True, True]


def test_cpu_and_other_families() -> None:
    assert [s.key for s in fallback_chain("cpu", {"sm_86"})] == ["cpu"]
    assert [s.key for s in fallback_chain("sm_90", {"sm_86", "sm_100"})] == ["sm_90", "cpu"]
    assert [s.key for s in fallback_chain("sm_100", {"sm_103", "sm_90"})] == ["sm_100", "sm_103", "cpu"]
    assert (family("sm_86"), family("sm_120"), family("cpu")) == ("sm_8x", "sm_12x", None)


def test_machine_keys_have_no_fallback() -> None:
    key = machine_key("sm_86", "NVIDIA RTX A5500; torch 2.14.1")
    assert key.startswith("sm_86.") and is_machine_key(key) and not is_machine_key("sm_86")
    assert key != machine_key("sm_86", "NVIDIA RTX A5500; torch 2.14.0")
    assert [s.key for s in fallback_chain(key, {"sm_86", "sm_80", "cpu", "sm_86.0badbeef"})] == [key]
    assert [s.key for s in fallback_chain("sm_86", {key, "sm_80"})] == ["sm_86", "sm_80", "cpu"]
    with pytest.raises(ValueError, match="already a machine key"):
        machine_key(key, "x")


def test_device_of_device_and_machine_keys() -> None:
    assert [device_of(k) for k in ("cpu", "sm_90", "cpu.1a2b3c4d", machine_key("sm_86", "x"))] == [
        "cpu", "sm_90", "cpu", "sm_86"]
    for bad in ("cpu.zz", "sm_90.", "gpu.1a2b3c4d", "cpu.1a2b3c4d.00000000"):
        with pytest.raises(ValueError, match="bad golden device key"):
            device_of(bad)


@pytest.mark.parametrize("key", ["gpu", "sm86", "sm_8", "../x", "", "cpu\n", "cpu.abc", "cpu.0123456789", "sm_90.ABCDEF12",
                                 "cpu.01234567\n"])
def test_bad_keys(key: str) -> None:
    with pytest.raises(ValueError, match="bad golden device key"):
        validate_key(key)
