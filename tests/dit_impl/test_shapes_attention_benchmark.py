"""benchmarks/shapes_attention.py on a small DiT with one runaway block (no GPU, no shipped weights): it finds
the block, says what bf16 does to its rows, and leaves no hook behind."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")


@pytest.fixture(scope="module")
def probe(load_benchmark):
    return load_benchmark("shapes_attention")


def _dit_with_a_runaway_block(factor: float) -> "torch.nn.Module":
    """Block 1's query and key projections scaled, as adaLN's scale does at low noise in the shipped weights."""
    from diffusers import DiTTransformer2DModel

    torch.manual_seed(0)
    model = DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=3, out_channels=3,
                                  num_layers=2, sample_size=32, patch_size=4, norm_num_groups=1,
                                  num_embeds_ada_norm=10, norm_type="ada_norm_zero",
                                  norm_elementwise_affine=False).eval()
    with torch.no_grad():
        for linear in (model.transformer_blocks[1].attn1.to_q, model.transformer_blocks[1].attn1.to_k):
            linear.weight.mul_(factor)
            linear.bias.mul_(factor)
    return model


def test_the_runaway_block_is_found_and_bf16_moves_its_rows(probe) -> None:
    model = _dit_with_a_runaway_block(30.0)
    rows, losses = probe.measure(model, [999, 0], images=4, seed=1, device="cpu")
    assert [(r["t"], r["block"]) for r in rows] == [(999, 0), (999, 1), (0, 0), (0, 1)]
    for t in (999, 0):
        calm, runaway = (r for r in rows if r["t"] == t)
        assert runaway["max_logit"] > 100 * calm["max_logit"]
        assert runaway["entropy_min_head"] < calm["entropy_min_head"]
        assert runaway["bf16_logit_error"] > 100 * calm["bf16_logit_error"]
        assert runaway["bf16_row_tv"] > calm["bf16_row_tv"]
        assert 0 <= calm["bf16_row_tv"] <= runaway["bf16_row_tv"] <= 1
    assert [r["t"] for r in losses] == [999, 0]
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["loss_bf16"]) for r in losses)
    assert all(not block._forward_pre_hooks and not block.attn1._forward_pre_hooks
               for block in model.transformer_blocks)
    text = probe.table(rows, losses, tokens=64)
    assert "t=999" in text and "t=0" in text and len(text.splitlines()) == 3 + len(rows)
