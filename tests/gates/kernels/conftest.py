"""Fixtures of the kernel gate suite: inputs for the DiT kernels, built fresh per seed."""

from __future__ import annotations

import pytest

@pytest.fixture
def dit_inputs():
    """``dit_inputs(B, N, H, dtype, device, strided_rows=False)`` -> ``make(seed)`` returning a dict of tensors.

    With ``strided_rows`` the [B, H] modulation rows are chunks of one [B, 6H] tensor (as DiT's adaLN
    produces them), so they are not contiguous.
    """

    def factory(B: int, N: int, H: int, dtype, device: str = "cuda", strided_rows: bool = False):
        import torch

        def make(seed: int) -> dict:
            g = torch.Generator(device=device).manual_seed(seed)
            x = torch.randn(B, N, H, dtype=dtype, device=device, generator=g)
            y = torch.randn(B, N, H, dtype=dtype, device=device, generator=g)
            if strided_rows:
                rows = torch.randn(B, 6 * H, dtype=dtype, device=device, generator=g).chunk(6, dim=1)[:3]
            else:
                rows = [torch.randn(B, H, dtype=dtype, device=device, generator=g) for _ in range(3)]
            return {"x": x, "y": y, "gate": rows[0], "scale": rows[1], "shift": rows[2]}

        return make

    return factory
