"""An output compared exactly (integer indices) fails with a count of the differing elements, not with
bounds and ratios that have no meaning there ('inf x its bound 0', '1.8e+308 x its allowance')."""

from __future__ import annotations

import pytest
import torch

from pytest_ditgate import GateFailure, check_kernel
from pytest_ditgate.correctness.inputs import make_tensor


def test_indices_that_differ_are_counted() -> None:
    def argmax_last_tie(x):
        return x.shape[-1] - 1 - torch.argmax(x.flip(-1), -1)

    with pytest.raises(GateFailure) as failure:
        check_kernel(argmax_last_tie, lambda x: torch.argmax(x, -1),
                     lambda s: (make_tensor((64, 512), "float32", seed=s).round(),), trials=1)
    message = failure.value.message
    assert failure.value.reason == "mismatch"
    assert "of 64 elements differ" in message and "int64 outputs are compared exactly" in message
    assert "x its bound" not in message and "e+308" not in message
