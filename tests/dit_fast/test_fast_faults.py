"""The equivalence comparison catches deliberately wrong optimisations; fall-backs are reported, not hidden."""

from __future__ import annotations

import warnings

import pytest

from pytest_ditgate.quality.metrics import rel_l2

torch = pytest.importorskip("torch")

from dit_impl.fast import AttentionFallback, FastOptions, from_diffusers  # noqa: E402
from dit_impl.fast import adaln, attention  # noqa: E402


def _out(model, inputs):
    x, t, y = inputs
    with torch.inference_mode():
        return model(x, timestep=t, class_labels=y).sample


def test_dropped_shift_term_is_caught(monkeypatch, tiny_reference, tiny_inputs, tiny_expected) -> None:
    model = from_diffusers(tiny_reference, FastOptions(dtype="float32"))
    assert rel_l2(_out(model, tiny_inputs), tiny_expected) < 1e-5
    monkeypatch.setattr(adaln, "norm_modulate",
                        lambda x, shift, scale, eps: torch.nn.functional.layer_norm(x, x.shape[-1:], eps=eps)
                        * (1 + scale[:, None]))
    assert rel_l2(_out(model, tiny_inputs), tiny_expected) > 1e-3


def test_ungated_residual_is_caught(monkeypatch, tiny_reference, tiny_inputs, tiny_expected) -> None:
    model = from_diffusers(tiny_reference, FastOptions(dtype="float32"))
    monkeypatch.setattr(adaln, "gated_residual", lambda x, gate, y: x + y)
    assert rel_l2(_out(model, tiny_inputs), tiny_expected) > 1e-3


def test_erf_gelu_epilogue_on_cpu_would_be_caught(tiny_reference, tiny_inputs, tiny_expected) -> None:
    """CPU's fused addmm+GELU is the erf GELU: forcing it past prepare() must fail the float32 bound."""
    model = from_diffusers(tiny_reference, FastOptions(dtype="float32", gelu_epilogue=True))
    assert rel_l2(_out(model, tiny_inputs), tiny_expected) < 1e-5  # prepare() turned it off on CPU
    for block in model.transformer_blocks:
        block.gelu_epilogue = True
    assert rel_l2(_out(model, tiny_inputs), tiny_expected) > 1e-5


def test_silent_math_fallback_warns_and_strict_raises(monkeypatch, tiny_reference, tiny_inputs) -> None:
    monkeypatch.setattr(attention, "dispatched_backend", lambda q, k, v, backend: "math")
    model = from_diffusers(tiny_reference, FastOptions(dtype="float32", sdpa="auto"))
    with pytest.warns(RuntimeWarning, match="fell back to the math path"):
        _out(model, tiny_inputs)
    assert model.report()["sdpa"]["fallback"] is True
    strict = from_diffusers(tiny_reference, FastOptions(dtype="float32", sdpa="auto", strict=True))
    with pytest.raises(AttentionFallback, match="math path"):
        _out(strict, tiny_inputs)


def test_probe_runs_once_per_shape(monkeypatch, tiny_reference, tiny_inputs) -> None:
    calls = []
    real = attention.dispatched_backend
    monkeypatch.setattr(attention, "dispatched_backend", lambda *a: calls.append(a[0].shape) or real(*a))
    model = from_diffusers(tiny_reference, FastOptions(dtype="float32"))
    _out(model, tiny_inputs)
    _out(model, tiny_inputs)
    x, t, y = tiny_inputs
    _out(model, (x[:2], t[:2], y[:2]))
    assert len(calls) == 2


def test_explicit_kernels_request_on_cpu_warns_and_falls_back(tiny_reference) -> None:
    with pytest.warns(RuntimeWarning, match="fell back to PyTorch"):
        model = from_diffusers(tiny_reference, FastOptions(dtype="float32", adaln="kernels"))
    assert model.report()["adaln"]["impl"] == "torch"
    with pytest.raises(RuntimeError, match="fell back"):
        from_diffusers(tiny_reference, FastOptions(dtype="float32", adaln="kernels", strict=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from_diffusers(tiny_reference, FastOptions(dtype="float32", adaln="auto"))  # auto: reported, silent


def test_seam_closing_with_this_blocks_modulation_is_caught(monkeypatch, tiny_reference, tiny_inputs,
                                                            tiny_expected) -> None:
    """The seam's likeliest slip, closing a block with its own pre-attention shift and scale instead of the
    next block's, fails the float32 bound."""
    from dit_impl.fast import model as fast_model_module

    model = from_diffusers(tiny_reference, FastOptions(dtype="float32", block_seam=True))
    assert rel_l2(_out(model, tiny_inputs), tiny_expected) < 1e-5
    real_forward = fast_model_module.FastBlock.forward

    def closes_with_own_modulation(self, x, mod, h=None, closing=None):
        if closing is not None and self is not model.transformer_blocks[-1]:
            closing = (*mod.chunk(6, dim=1)[:2], closing[2])
        return real_forward(self, x, mod, h=h, closing=closing)

    monkeypatch.setattr(fast_model_module.FastBlock, "forward", closes_with_own_modulation)
    assert rel_l2(_out(model, tiny_inputs), tiny_expected) > 1e-3
