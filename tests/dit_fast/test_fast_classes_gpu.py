"""The fast DiT's switches of the other experiment classes on a GPU: fp8 GEMMs (``torch._scaled_mm``, sm_89+) and
their refusal below, weight-only int8, TF32 around the forward (and the judge's observer counting it), fp16
latents reaching a bf16 VAE, and the sampler's approximations on CUDA.

The reference is diffusers' DiT in float32 (TF32 off) on the same weights (4 blocks of DiT-XL/2's shapes), as in
test_fast_gpu.py; fp8's bound is its float emulation on the same device, which computes the same roundings.
"""

from __future__ import annotations

import pytest

from pytest_ditgate.quality.metrics import rel_l2

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

from dit_impl.fast import FastOptions, fast_transformer  # noqa: E402
from test_fast_gpu import xl_blocks  # noqa: E402,F401 - 4 blocks of DiT-XL/2 in diffusers, float32 outputs

GPU = pytest.mark.requires_gpu(cc=">=8.0", bf16=True)
FP8 = pytest.mark.requires_gpu(cc=">=8.9", bf16=True, why="fp8 GEMMs (torch._scaled_mm)")


def run(model, inputs):
    x, t, y = inputs
    with torch.inference_mode():
        return model(x, timestep=t, class_labels=y).sample


@FP8
@pytest.mark.parametrize("switches", ["quant=fp8", "quant=fp8_tensor", "quant=fp8,cuda_graphs=1",
                                      "quant=fp8,compile=blocks", "quant=fp8,dtype=float32"])
def test_fp8_gemms_compute_what_their_emulation_computes(xl_blocks, switches) -> None:
    from pytest_ditgate.experiment.observe import Evidence, make_observer

    ref, inputs, expected, _ = xl_blocks
    options = FastOptions.parse(switches, FastOptions(dtype="bfloat16"))
    model = fast_transformer(ref, options)
    emulated = fast_transformer(ref, options.replace(fp8_emulate=True, cuda_graphs=False, compile="off"))
    out, want = run(model, inputs), run(emulated, inputs)
    assert "torch._scaled_mm" in fast_transformer(ref, options.replace(cuda_graphs=False)).report()["quant"]
    assert rel_l2(out.float(), want.float()) < 2e-2, switches  # accumulation order and bf16 out only
    assert rel_l2(out.float(), expected) < 0.15, switches  # fp8 e4m3: a few % per GEMM, not broken
    evidence = Evidence()
    with make_observer(evidence):
        run(fast_transformer(ref, options.replace(cuda_graphs=False, compile="off")), inputs)
    assert any("_scaled_mm" in item and "float8_e4m3fn" in item for item in evidence.items), evidence.items


@pytest.mark.requires_gpu(cc="<8.9", why="a GPU without fp8 GEMMs")
def test_fp8_gemms_are_refused_below_sm_89_with_the_reason(xl_blocks) -> None:
    from dit_impl.fast.quant import QuantizationUnavailable

    ref, _, _, _ = xl_blocks
    with pytest.raises(QuantizationUnavailable, match=r"need sm_89 or newer; this device is sm_\d+"):
        fast_transformer(ref, FastOptions(dtype="bfloat16", quant="fp8"))


@GPU
@pytest.mark.parametrize("mode", ["int8_weight", "fp8_weight"])
def test_weight_only_modes_run_and_stay_close(xl_blocks, mode) -> None:
    ref, inputs, expected, _ = xl_blocks
    out = run(fast_transformer(ref, FastOptions(dtype="bfloat16", quant=mode)), inputs)
    assert rel_l2(out.float(), expected) < (0.05 if mode == "int8_weight" else 0.1)


@GPU
def test_tf32_runs_inside_the_forward_and_the_observer_counts_it(xl_blocks) -> None:
    from pytest_ditgate.experiment.observe import Evidence, make_observer

    ref, inputs, expected, _ = xl_blocks
    plain = fast_transformer(ref, FastOptions(dtype="float32"))
    tf32 = fast_transformer(ref, FastOptions(dtype="float32", tf32=True))
    evidence, other = Evidence(), Evidence()
    with make_observer(evidence):
        fast = run(tf32, inputs)
    with make_observer(other):
        exact = run(plain, inputs)
    assert evidence.tf32_gemms > 0 and other.tf32_gemms == 0
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32  # restored
    assert not torch.equal(fast, exact)  # TF32 did run
    assert rel_l2(fast, expected) < 5e-3 and rel_l2(exact, expected) < 1e-5


@GPU
def test_fp16_latents_reach_a_bf16_vae_and_the_sampler_approximates_on_cuda() -> None:
    """The DiT lane's GPU setting: the baseline's VAE in bf16, an fp16 candidate transformer."""
    from dit_impl.baseline import load_model
    from dit_impl.fast import fast_model
    from dit_impl.fast.sampler import SamplerOptions, sample

    baseline = load_model("tiny", seed=0, dtype="bfloat16", device="cuda")
    half = fast_model(baseline, FastOptions(dtype="float16"))
    case = dict(class_labels=[1, 207], seed=0, steps=6)
    result = sample(half, **case)
    assert result.latents.dtype == torch.float16 and result.images.dtype == torch.bfloat16
    for options in (SamplerOptions(step_fraction=0.5), SamplerOptions(guidance_cutoff=0.5),
                    SamplerOptions(block_cache=(0, 1, 2))):
        approximated = sample(half, **case, options=options)
        assert torch.isfinite(approximated.images.float()).all(), options
    graphed = fast_model(baseline, FastOptions(dtype="float16", cuda_graphs=True))
    with pytest.raises(ValueError, match="a CUDA graph replays every block"):
        sample(graphed, **case, options=SamplerOptions(block_cache=(0, 1, 2)))
