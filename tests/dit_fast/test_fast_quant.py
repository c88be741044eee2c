"""Low-bit linears of the fast DiT (``FastOptions.quant``, dit_impl/fast/quant.py) on the CPU: what each mode
stores and computes, the fp8 GEMM modes refused where they cannot run, and every mode detected as quantization
from what executes (the judge's observer, the candidate declaration's scan)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dit_impl.baseline import load_model  # noqa: E402
from dit_impl.fast import FastOptions, fast_model  # noqa: E402
from dit_impl.fast.quant import QuantizationUnavailable, QuantizedLinear, quantize_blocks  # noqa: E402
from pytest_ditgate.quality.metrics import rel_l2  # noqa: E402

MODES = ("int8_weight", "fp8_weight", "fp8", "fp8_tensor", "int4_noscale")


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", seed=2)


def quantized(tiny, mode: str):
    return fast_model(tiny, FastOptions(dtype="float32", sdpa="math", quant=mode, fp8_emulate=True))


def test_each_mode_stores_low_bit_weights_and_says_what_runs(tiny) -> None:
    stored = {"int8_weight": torch.int8, "fp8_weight": torch.float8_e4m3fn, "fp8": torch.float8_e4m3fn,
              "fp8_tensor": torch.float8_e4m3fn, "int4_noscale": torch.int8}
    for mode in MODES:
        model = quantized(tiny, mode).transformer
        linears = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
        assert len(linears) == 2 * 4, mode  # QKV, attention-out, fc1, fc2 of each of the 2 blocks
        assert {m.weight_q.dtype for m in linears} == {stored[mode]}, mode
        assert model.report()["quant"].startswith(f"{mode}: 8 block linears"), model.report()["quant"]
    assert "emulated" in quantized(tiny, "fp8").transformer.report()["quant"]
    assert quantized(tiny, "int4_noscale").transformer.transformer_blocks[0].fc1.weight_scale is None


def test_honest_modes_stay_close_and_int4_without_scales_breaks_the_linear() -> None:
    generator = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(256, 512)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(512, 256, generator=generator) * 0.05)
    x = torch.randn(64, 256, generator=generator)
    expected = linear(x).detach()
    errors = {mode: rel_l2(QuantizedLinear(linear, mode, emulate=True)(x).detach(), expected) for mode in MODES}
    assert errors["int8_weight"] < 0.01 and errors["fp8_weight"] < 0.05
    assert errors["fp8"] < 0.08 and errors["fp8_tensor"] < 0.1
    assert errors["int4_noscale"] > 0.9  # weights of 0.05 round to zero: only the bias is left


def test_fp8_gemms_are_refused_where_they_cannot_run(tiny) -> None:
    for mode in ("fp8", "fp8_tensor"):
        with pytest.raises(QuantizationUnavailable, match=r"fp8 GEMMs \(torch._scaled_mm\) need an NVIDIA GPU of "
                                                          r"sm_89 or newer; the model is on cpu"):
            fast_model(tiny, FastOptions(dtype="float32", sdpa="math", quant=mode))
    # weight-only modes dequantize: they run anywhere
    fast_model(tiny, FastOptions(dtype="float32", sdpa="math", quant="fp8_weight"))


def test_fp8_gemms_refuse_sizes_scaled_mm_cannot_take() -> None:
    from dit_impl.fast.model import DitShape, FastDiT

    model = FastDiT(DitShape(num_attention_heads=1, attention_head_dim=8, in_channels=4, out_channels=4,
                             num_layers=1, sample_size=4, patch_size=2))
    with pytest.raises(QuantizationUnavailable, match="divisible by 16"):
        quantize_blocks(model, "fp8", emulate=True)


def test_the_options_name_an_unknown_mode() -> None:
    with pytest.raises(ValueError, match="FastOptions.quant='int2'"):
        FastOptions(quant="int2")
    assert FastOptions.parse("quant=fp8,fp8_emulate=1").label() == "quant=fp8,fp8_emulate=1"


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_is_quantization_by_what_executes(tiny, mode) -> None:
    """The judge's observer (a dispatch mode over one forward, then the module scan) and the declaration's
    scan both find it, whatever the candidate claims."""
    from pytest_ditgate.experiment.observe import Evidence, make_observer, scan_modules
    from pytest_ditgate.verdict.classify import classify, quantization_evidence

    model = quantized(tiny, mode).transformer
    evidence = Evidence()
    x = torch.randn(2, 4, 8, 8)
    with torch.inference_mode(), make_observer(evidence):
        model(x, timestep=torch.tensor([5, 5]), class_labels=torch.tensor([1, 2]))
    scan_modules(evidence)
    assert evidence.items, mode
    assert classify("numerical", quantization=evidence.items).effective == "quantization"
    assert quantization_evidence([model]), mode
