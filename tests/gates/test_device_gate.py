"""Gate suite: the device this run is judged on is known, and GPU-only checks run exactly where they can."""

from __future__ import annotations

import pytest


def test_device_is_identified(ditgate_device) -> None:
    if ditgate_device.is_cuda:
        assert ditgate_device.cc is not None and ditgate_device.arch == "sm_{}{}".format(*ditgate_device.cc)
        assert ditgate_device.sm_count and ditgate_device.total_memory_bytes and ditgate_device.l2_bytes
        assert ditgate_device.gpu_count >= 1
    else:
        assert ditgate_device.gpu_count == 0 and ditgate_device.cc is None


@pytest.mark.requires_gpu(bf16=True, why="bf16 tensor math")
def test_bf16_matmul_on_gpu() -> None:
    import torch

    a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    ref = a.double() @ a.double()
    out = (a @ a).double()
    assert ((out - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.requires_gpu(sdpa="flash", why="flash attention")
def test_flash_sdpa_runs() -> None:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(2, 4, 128, 64, device="cuda", dtype=torch.bfloat16)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q)
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), q.double(), q.double())
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.requires_gpu(cc=">=8.9", why="fp8")
def test_fp8_round_trip() -> None:
    """Runs on Ada/Hopper; under the a5500 profile it skips with 'needs sm>=8.9 for fp8'."""
    import torch

    x = torch.randn(1024, device="cuda", dtype=torch.float32)
    back = x.to(torch.float8_e4m3fn).to(torch.float32)
    assert ((back - x).norm() / x.norm()).item() < 0.1
