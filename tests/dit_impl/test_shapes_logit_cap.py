"""The attention-logit cap of the shapes DiT's training: it reads the logits diffusers computes, its penalty
is zero under the cap and pulls a runaway block back, and training records the peak and leaves no hook."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")


def _small_dit(layers: int = 2) -> "torch.nn.Module":
    from diffusers import DiTTransformer2DModel

    torch.manual_seed(0)
    return DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=3, out_channels=3,
                                 num_layers=layers, sample_size=16, patch_size=4, norm_num_groups=1,
                                 num_embeds_ada_norm=10, norm_type="ada_norm_zero", norm_elementwise_affine=False)


def _inputs(batch: int = 3) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]:
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(batch, 3, 16, 16, generator=generator), torch.tensor([0, 400, 999][:batch]),
            torch.tensor([1, 2, 10][:batch]))


def _runaway(model: "torch.nn.Module", block: int = 1, factor: float = 40.0) -> "torch.nn.Module":
    """Scale one block's query and key projections, as adaLN's scale does at low noise in the shipped weights."""
    attention = model.transformer_blocks[block].attn1
    with torch.no_grad():
        for linear in (attention.to_q, attention.to_k):
            linear.weight.mul_(factor)
            linear.bias.mul_(factor)
    return model


def test_row_maxima_are_those_of_the_attention_diffusers_computes() -> None:
    """Softmax over the logits the cap reads, times the values, gives the attention's own output: same heads,
    same scale."""
    from dit_impl.shapes.logit_cap import row_maxima

    model = _small_dit().eval()
    seen: dict[str, "torch.Tensor"] = {}

    def keep(_module, args, kwargs, output):
        seen["in"], seen["out"] = (args[0] if args else kwargs["hidden_states"]), output

    attention = model.transformer_blocks[0].attn1
    handle = attention.register_forward_hook(keep, with_kwargs=True)
    x, t, labels = _inputs()
    with torch.no_grad():
        model(x, timestep=t, class_labels=labels)
        handle.remove()
        hidden = seen["in"]
        batch, tokens, _ = hidden.shape

        def split(x):
            return x.view(batch, tokens, attention.heads, -1).transpose(1, 2)

        q, k, v = split(attention.to_q(hidden)), split(attention.to_k(hidden)), split(attention.to_v(hidden))
        logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        mixed = (logits.softmax(-1) @ v).transpose(1, 2).reshape(batch, tokens, -1)
        torch.testing.assert_close(attention.to_out[0](mixed), seen["out"], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(row_maxima(attention, hidden), logits.amax(-1))


def test_the_penalty_is_zero_under_the_cap_and_pulls_a_runaway_block_back() -> None:
    from dit_impl.shapes.logit_cap import LogitCap

    x, t, labels = _inputs()
    model = _small_dit()
    cap = LogitCap(model, cap=1e6)
    model(x, timestep=t, class_labels=labels)
    assert float(cap.penalty().detach()) == 0.0

    model = _runaway(_small_dit())
    cap = LogitCap(model, cap=5.0, weight=1.0)
    model(x, timestep=t, class_labels=labels)
    start = cap.peak()
    penalty = cap.penalty()
    assert start > 5.0 and float(penalty.detach()) > 0
    penalty.backward()
    runaway = model.transformer_blocks[1]
    assert float(runaway.attn1.to_q.weight.grad.abs().sum()) > 0
    assert float(runaway.norm1.linear.weight.grad.abs().sum()) > 0  # adaLN's scale is pulled back too
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(40):
        optimiser.zero_grad()
        model(x, timestep=t, class_labels=labels)
        cap.penalty().backward()
        optimiser.step()
    model(x, timestep=t, class_labels=labels)
    assert cap.peak() < start / 2


def test_the_cap_can_read_a_slice_of_each_batch() -> None:
    """Training reads the logits of a slice of its batch: the first images' rows, and only theirs."""
    from dit_impl.shapes.logit_cap import LogitCap

    model = _runaway(_small_dit())
    x, t, labels = _inputs()
    whole, first = LogitCap(model), LogitCap(model, images=1)
    model(x, timestep=t, class_labels=labels)
    assert [m.shape[0] for m in first._maxima] == [1, 1] and [m.shape[0] for m in whole._maxima] == [3, 3]
    assert first.peak() <= whole.peak()
    sliced_rows = list(first._maxima)
    first.remove()
    whole.remove()
    alone = LogitCap(model)
    model(x[:1], timestep=t[:1], class_labels=labels[:1])
    for sliced, single in zip(sliced_rows, alone._maxima):
        torch.testing.assert_close(sliced, single, rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="at least one image"):
        LogitCap(model, images=0)


@pytest.mark.slow
@pytest.mark.gpu_check  # torch.compile's C++ build: about 50 s of CPU on a fresh machine
def test_the_penalty_trains_through_a_compiled_bf16_step() -> None:
    """How training uses it: hooks traced by torch.compile, the step under bf16 autocast. Read in bf16 there,
    the penalty's gradients were non-finite; in float32 they are finite and the penalty is the eager one."""
    from dit_impl.shapes.logit_cap import LogitCap
    from dit_impl.shapes.training import single_label_drop

    model = _runaway(_small_dit(layers=1), block=0)
    single_label_drop(model)  # diffusers' random label drop would give eager and compiled other inputs
    x, t, labels = _inputs()
    cap = LogitCap(model, cap=1.0, weight=1.0)
    penalties, grads = [], []
    for forward in (model, torch.compile(model)):
        model.zero_grad()
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            out = forward(x, timestep=t, class_labels=labels).sample
        penalty = cap.penalty()
        (out.float().pow(2).mean() + penalty).backward()
        penalties.append(float(penalty.detach()))
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert all(bool(torch.isfinite(g).all()) for g in grads)
    assert penalties[0] > 0 and penalties[1] == pytest.approx(penalties[0], rel=1e-3)


def test_row_maxima_read_float32_logits_under_bf16_autocast() -> None:
    from dit_impl.shapes.logit_cap import attention_logits, row_maxima

    attention = _runaway(_small_dit()).transformer_blocks[1].attn1
    hidden = torch.randn(2, 16, attention.to_q.in_features, generator=torch.Generator().manual_seed(2))
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        maxima = row_maxima(attention, hidden)
    assert maxima.dtype == torch.float32
    torch.testing.assert_close(maxima, attention_logits(attention, hidden).amax(-1))


def test_the_cap_checks_its_numbers_and_needs_a_forward() -> None:
    from dit_impl.shapes.logit_cap import LogitCap

    for cap, weight in ((0.0, 0.01), (float("nan"), 0.01), (50.0, -1.0), (float("inf"), 0.01)):
        with pytest.raises(ValueError, match="logit cap"):
            LogitCap(_small_dit(), cap=cap, weight=weight)
    with pytest.raises(RuntimeError, match="no forward"):
        LogitCap(_small_dit()).penalty()


def test_attention_peak_leaves_the_model_as_it_found_it() -> None:
    from dit_impl.shapes.logit_cap import attention_peak

    model = _runaway(_small_dit()).train()
    x, t, labels = _inputs()
    peak, prediction = attention_peak(model, x, t, labels)
    assert peak > 5.0 and model.training and prediction.shape == x.shape
    assert all(not block.attn1._forward_hooks for block in model.transformer_blocks)
    assert attention_peak(model, x, t, labels)[0] == peak


@pytest.mark.parametrize("logit_cap", [50.0, None])
def test_training_watches_the_model_and_its_ema_and_removes_its_hooks(logit_cap) -> None:
    """What ships is the EMA: each window records its losses at low noise and over every t, and its attention
    peak, beside the model's (the shipped EMA's loss at t = 50 is 0.43, hidden in a mean over all t)."""
    from dit_impl.shapes.training import train_dit

    model = _small_dit(layers=1)
    ema, log = train_dit(model, "cpu", 0, steps=8, batch=4, max_seconds=1e9, check_every=4, logit_cap=logit_cap,
                         log=lambda _: None)
    assert [window["step"] for window in log.numbers["windows"]] == [4, 8]
    for window in log.numbers["windows"]:
        for who in ("model", "ema"):
            numbers = window[who]
            assert set(numbers) == {"low_noise_loss", "spread_loss", "attention_peak"}
            assert all(math.isfinite(value) and value > 0 for value in numbers.values())
        assert window["model"] != window["ema"]
    assert log.numbers["logit_cap"] == ({"cap": 50.0, "weight": 0.01, "images": 256} if logit_cap else None)
    assert all(not block.attn1._forward_hooks for block in model.transformer_blocks)
    assert all(not block.attn1._forward_hooks for block in ema.transformer_blocks)


def test_a_capped_run_keeps_a_runaway_block_lower_than_an_uncapped_one() -> None:
    from dit_impl.shapes.training import train_dit

    peaks, losses = {}, {}
    for logit_cap in (None, 2.0):
        _, log = train_dit(_runaway(_small_dit(layers=2), factor=20.0), "cpu", 0, steps=60, batch=4,
                           max_seconds=1e9, check_every=20, lr=2e-2, logit_cap=logit_cap, log=lambda _: None)
        last = log.numbers["windows"][-1]
        peaks[logit_cap], losses[logit_cap] = last["model"]["attention_peak"], last["loss"]
    # the block started at a peak of about 580: uncapped it grows, capped it is brought to the cap
    assert peaks[2.0] < 2 * 2.0 < 100 < peaks[None]
    assert losses[2.0] < 1.5 * losses[None]  # and the model still learns
