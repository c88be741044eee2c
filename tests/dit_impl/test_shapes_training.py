"""The shapes DiT training loop: a collapsed run rolls back to its last good weights instead of shipping them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")


def _small_dit() -> "torch.nn.Module":
    from diffusers import DiTTransformer2DModel

    return DiTTransformer2DModel(num_attention_heads=1, attention_head_dim=8, in_channels=3, out_channels=3,
                                 num_layers=1, sample_size=32, patch_size=8, norm_num_groups=1,
                                 num_embeds_ada_norm=10, norm_type="ada_norm_zero", norm_elementwise_affine=False)


class _BreaksAt(torch.nn.Module):
    """A DiT whose prediction is NaN on calls ``first`` to ``last`` (a run that blew up)."""

    def __init__(self, inner: "torch.nn.Module", first: int, last: int) -> None:
        super().__init__()
        self.inner, self.first, self.last, self.calls = inner, first, last, 0

    def forward(self, sample, timestep, class_labels):
        self.calls += 1
        out = self.inner(sample, timestep=timestep, class_labels=class_labels).sample
        if self.first <= self.calls <= self.last:
            out = out * float("nan")
        return SimpleNamespace(sample=out)


def test_a_healthy_run_has_no_rollback() -> None:
    from dit_impl.shapes.training import train_dit

    ema, log = train_dit(_small_dit(), "cpu", 0, steps=8, batch=4, max_seconds=1e9, check_every=4, log=lambda _: None)
    assert log.steps == 8 and log.numbers["rollbacks"] == []
    assert all(bool(torch.isfinite(p).all()) for p in ema.parameters())


def test_a_collapsed_run_rolls_back_to_the_start_of_the_last_good_window() -> None:
    from dit_impl.shapes.training import train_dit

    messages: list[str] = []
    model = _BreaksAt(_small_dit(), first=10, last=11)
    ema, log = train_dit(model, "cpu", 0, steps=20, batch=4, max_seconds=1e9, check_every=4, log=messages.append)
    # windows 1-4 and 5-8 were good; 9-12 broke: back to step 4, the start of the last good window (the
    # state at its end, step 8, may already be inside the spike), at half the learning rate
    (rollback,) = log.numbers["rollbacks"]
    assert rollback["step"] == 12 and rollback["back_to"] == 4 and rollback["lr_scale"] == 0.5
    assert any("rolled back to step 4" in message for message in messages)
    # the weights that ship (the EMA) and the trained ones are finite again, and training went on to the end
    assert log.steps == 20
    assert all(bool(torch.isfinite(p).all()) for p in ema.parameters())
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
