"""The plugin's report hooks run while a test's monkeypatches are still in force: on a GPU host a test that
patches ``torch.cuda`` to fail (as the device-detection tests do) must be reported, not end the session."""

from __future__ import annotations

import pytest


def test_a_test_that_breaks_torch_cuda_is_reported_not_an_internal_error(pytester: pytest.Pytester) -> None:
    pytest.importorskip("torch")
    pytester.makepyfile(
        """
        import torch

        def test_breaks_cuda(monkeypatch):
            def broken(*args, **kwargs):
                raise RuntimeError("Found no NVIDIA driver on your system")

            # as on a GPU host whose CUDA an earlier test initialised
            monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
            monkeypatch.setattr(torch.cuda, "is_available", broken)
            monkeypatch.setattr(torch.cuda, "max_memory_allocated", broken)

        def test_after():
            pass
        """
    )
    result = pytester.runpytest_inprocess("--ditgate", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    assert "INTERNALERROR" not in result.stdout.str()
