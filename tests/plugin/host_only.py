"""Run a test as on a machine without a GPU, also on a GPU host (the GPU check runs the plugin's tests on
one): import :func:`no_cuda` into a test module and use it as a fixture."""

from __future__ import annotations

import sys

import pytest


def hide_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """No CUDA device for this process (torch reports none) and for the processes it starts."""
    from pytest_ditgate import device

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    torch = sys.modules.get("torch")
    if torch is not None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    device.clear_cache()


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test exercises the host-only path: a GPU host hides its device for it."""
    hide_cuda(monkeypatch)
