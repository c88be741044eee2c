"""The shapes DiT training loop: a collapsed run rolls back to its last good weights, a run that gets worse
ships the weights of its best window, and labels are dropped for guidance once."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")


def _small_dit() -> "torch.nn.Module":
    from diffusers import DiTTransformer2DModel

    return DiTTransformer2DModel(num_attention_heads=1, attention_head_dim=8, in_channels=3, out_channels=3,
                                 num_layers=1, sample_size=32, patch_size=8, norm_num_groups=1,
                                 num_embeds_ada_norm=10, norm_type="ada_norm_zero", norm_elementwise_affine=False)


class _Faulty(torch.nn.Module):
    """A DiT whose prediction ``fault`` changes on some training calls (counted from 1; the loop's attention
    watch runs in eval mode and is not counted)."""

    def __init__(self, inner: "torch.nn.Module") -> None:
        super().__init__()
        self.inner, self.calls = inner, 0

    @property
    def transformer_blocks(self):
        return self.inner.transformer_blocks

    def fault(self, out: "torch.Tensor") -> "torch.Tensor":
        raise NotImplementedError

    def forward(self, sample, timestep, class_labels):
        self.calls += self.training
        return SimpleNamespace(sample=self.fault(self.inner(sample, timestep=timestep, class_labels=class_labels).sample))


class _BreaksAt(_Faulty):
    """A DiT whose prediction is NaN on calls ``first`` to ``last`` (a run that blew up)."""

    def __init__(self, inner: "torch.nn.Module", first: int, last: int) -> None:
        super().__init__(inner)
        self.first, self.last = first, last

    def fault(self, out):
        return out * float("nan") if self.first <= self.calls <= self.last else out


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


def test_a_second_rollback_to_the_same_window_restores_it_as_it_was() -> None:
    """The collapse lasts into the window after the first rollback: the run goes back to the same good window
    twice. An optimiser keeps the tensors it is loaded with, so the first restore must not hand it the
    snapshot's own moments (the collapse's NaN gradients would then reach the snapshot, and the second restore
    would bring them back)."""
    from dit_impl.shapes.training import train_dit

    model = _BreaksAt(_small_dit(), first=10, last=14)
    ema, log = train_dit(model, "cpu", 0, steps=28, batch=4, max_seconds=1e9, check_every=4, log=lambda _: None)
    assert [(r["step"], r["back_to"]) for r in log.numbers["rollbacks"]] == [(12, 4), (16, 4)]
    assert all(math.isfinite(window["loss"]) for window in log.numbers["windows"][-3:])
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
    assert all(bool(torch.isfinite(p).all()) for p in ema.parameters())


class _WorseAfter(_Faulty):
    """A DiT whose prediction is off by a constant from call ``first`` on: the loss climbs, without doubling."""

    def __init__(self, inner: "torch.nn.Module", first: int) -> None:
        super().__init__(inner)
        self.first = first

    def fault(self, out):
        return out + 0.6 if self.calls >= self.first else out


def test_a_run_that_gets_worse_ships_the_ema_of_its_best_window() -> None:
    """The H200 probe's run climbed slowly at a low rate and shipped its end (accuracy 0.165)."""
    from dit_impl.shapes.training import train_dit

    messages: list[str] = []
    model = _WorseAfter(_small_dit(), first=13)
    ema, log = train_dit(model, "cpu", 0, steps=24, batch=4, max_seconds=1e9, check_every=4, log=messages.append)
    windows = {window["step"]: window["loss"] for window in log.numbers["windows"]}
    shipped = log.numbers["shipped"]
    assert log.numbers["rollbacks"] == []  # no window doubled: no spike, only a climb
    assert shipped["step"] <= 12 and shipped["window_loss"] == pytest.approx(min(windows.values()), rel=1e-5)
    assert min(windows[s] for s in (16, 20, 24)) > max(windows[s] for s in (4, 8, 12))  # it did get worse
    assert any(f"shipping the EMA at step {shipped['step']}" in m for m in messages)


def test_labels_are_dropped_for_guidance_by_the_loop_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """diffusers' LabelEmbedding drops 10 % in train mode, in every block on its own draw: with the loop's drop
    at 0, no null label (class 10) may reach any block's table (its own drop would show about 10 %)."""
    from dit_impl.shapes import training

    monkeypatch.setattr(training, "LABEL_DROP", 0.0)
    model = _small_dit()
    seen: list[int] = []
    for module in model.modules():
        if hasattr(module, "token_drop"):
            module.embedding_table.register_forward_pre_hook(lambda _m, args: seen.extend(args[0].tolist()))
    training.train_dit(model, "cpu", 0, steps=20, batch=4, max_seconds=1e9, check_every=4, log=lambda _: None)
    assert len(seen) >= 80 and 10 not in seen


def test_a_spike_is_judged_against_the_recent_level_not_the_best_window_ever() -> None:
    """One lucky window (0.009 among 0.02s) must not turn every later ordinary window into a rollback."""
    from dit_impl.shapes.training import spiked

    accepted = [0.9, 0.1, 0.03, 0.009, 0.021, 0.02]
    assert not spiked(0.019, accepted)  # the best-window rule rolled this back (0.019 > 2 x 0.009)
    assert spiked(0.05, accepted)  # a real divergence still is one
    assert spiked(float("nan"), accepted) and spiked(float("inf"), [])
    assert not spiked(5.0, [])  # the first window has nothing to compare with


def test_the_losses_kept_per_step_do_not_hold_their_batches() -> None:
    import torch.nn.functional as F

    from dit_impl.shapes.training import kept_loss

    predicted, noise = torch.randn(64, 3, 32, 32), torch.randn(64, 3, 32, 32)
    loss = F.mse_loss(predicted, noise)
    kept = kept_loss(loss)
    # one float32, not the 64 images' unreduced storage that mse_loss's scalar can sit on
    assert kept.untyped_storage().nbytes() == 4
    assert float(kept) == float(loss) and not kept.requires_grad
