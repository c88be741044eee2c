"""CPU-runnable: the PyTorch references equal the textbook formulas (no GPU, no gates needed)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, strategies as st  # noqa: E402

from kernels import reference as ref  # noqa: E402

shapes = st.tuples(st.integers(1, 3), st.integers(1, 9), st.integers(1, 80))


def _textbook_layernorm_modulate(x, scale, shift, eps):
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


@given(shape=shapes, seed=st.integers(0, 2**16), eps=st.sampled_from([1e-6, 1e-5, 0.1]))
def test_layernorm_modulate_reference(shape, seed, eps) -> None:
    B, N, H = shape
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, N, H, dtype=torch.float64, generator=g)
    scale, shift = torch.randn(2, B, H, dtype=torch.float64, generator=g)
    torch.testing.assert_close(ref.layernorm_modulate_ref(x, scale, shift, eps),
                               _textbook_layernorm_modulate(x, scale, shift, eps), rtol=1e-10, atol=1e-10)


@given(shape=shapes, seed=st.integers(0, 2**16))
def test_gated_residual_references(shape, seed) -> None:
    B, N, H = shape
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(2, B, N, H, dtype=torch.float64, generator=g)
    gate, scale, shift = torch.randn(3, B, H, dtype=torch.float64, generator=g)
    expected = torch.stack([x[b] + gate[b] * y[b] for b in range(B)])
    torch.testing.assert_close(ref.gated_residual_ref(x, gate, y), expected, rtol=0, atol=0)
    x_new, out = ref.gated_residual_layernorm_modulate_ref(x, gate, y, scale, shift, 1e-6)
    torch.testing.assert_close(x_new, expected, rtol=0, atol=0)
    torch.testing.assert_close(out, _textbook_layernorm_modulate(expected, scale, shift, 1e-6), rtol=1e-10, atol=1e-10)


def test_modulation_is_per_batch_not_per_token() -> None:
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    scale = torch.stack([torch.zeros(4), torch.ones(4)]).double()
    shift = torch.zeros(2, 4, dtype=torch.float64)
    out = ref.layernorm_modulate_ref(x, scale, shift)
    torch.testing.assert_close(out[1], 2 * ref.layernorm_modulate_ref(x[1:], scale[:1], shift[:1])[0])
