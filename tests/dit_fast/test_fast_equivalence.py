"""The fast DiT computes diffusers' DiTTransformer2DModel function, per CPU-valid switch combination."""

from __future__ import annotations

import pytest

from pytest_ditgate.quality.metrics import rel_l2

torch = pytest.importorskip("torch")

from dit_impl.fast import FastOptions, from_diffusers  # noqa: E402

FP32_SWITCHES = [
    "dtype=float32",
    "dtype=float32,fused_qkv=0",
    "dtype=float32,sdpa=math",
    "dtype=float32,sdpa=math,fused_qkv=0,batched_conditioning=0",
    "dtype=float32,batched_conditioning=0",
    "dtype=float32,adaln=auto,gelu_epilogue=1",  # both fall back on CPU, and say so in the report
    "dtype=float32,block_seam=1",
    "dtype=float32,block_seam=1,fused_qkv=0,batched_conditioning=0",
]


def _run(model, inputs):
    x, t, y = inputs
    with torch.inference_mode():
        return model(x.to(model.dtype), timestep=t, class_labels=y).sample


@pytest.mark.parametrize("switches", FP32_SWITCHES)
def test_float32_switches_match_diffusers(switches, tiny_reference, tiny_inputs, tiny_expected) -> None:
    model = from_diffusers(tiny_reference, FastOptions.parse(switches))
    out = _run(model, tiny_inputs)
    assert out.shape == tiny_expected.shape and out.dtype == torch.float32
    assert rel_l2(out, tiny_expected) < 1e-5


def test_bfloat16_stays_within_bf16_error_of_diffusers(tiny_reference, tiny_inputs, tiny_expected) -> None:
    model = from_diffusers(tiny_reference, FastOptions(dtype="bfloat16"))
    out = _run(model, tiny_inputs)
    assert out.dtype == torch.bfloat16
    ref_bf16 = torch.nn.Module.to(type(tiny_reference)(**tiny_reference.config), dtype=torch.bfloat16)
    ref_bf16.load_state_dict(tiny_reference.state_dict())
    baseline_error = rel_l2(_run(ref_bf16.eval(), tiny_inputs), tiny_expected)
    assert rel_l2(out, tiny_expected) < max(2 * baseline_error, 1e-3)


def test_shared_embedders_are_stored_once_and_still_match(tiny_reference, tiny_inputs) -> None:
    """Converted DiT checkpoints give every block the same embedder: the fast model keeps one copy."""
    sd = {k: v.clone() for k, v in tiny_reference.state_dict().items()}
    for key in [k for k in sd if k.startswith("transformer_blocks.1.norm1.emb.")]:
        sd[key] = sd[key.replace("blocks.1.", "blocks.0.")].clone()
    shared = type(tiny_reference)(**tiny_reference.config).eval()
    shared.load_state_dict(sd)
    model = from_diffusers(shared, FastOptions(dtype="float32"))
    assert model.report()["shared_embedder"] is True
    assert model.cond.t_w1.shape[0] == 1
    with torch.inference_mode():
        expected = shared(tiny_inputs[0], timestep=tiny_inputs[1], class_labels=tiny_inputs[2]).sample
    assert rel_l2(_run(model, tiny_inputs), expected) < 1e-5


def test_scalar_timestep_is_broadcast_like_diffusers(tiny_reference, tiny_inputs) -> None:
    x, _, y = tiny_inputs
    model = from_diffusers(tiny_reference, FastOptions(dtype="float32"))
    with torch.inference_mode():
        expected = tiny_reference(x, timestep=torch.full((4,), 250), class_labels=y).sample
        out = model(x, timestep=torch.tensor(250), class_labels=y).sample
    assert rel_l2(out, expected) < 1e-5


def test_report_says_what_ran_on_cpu(tiny_reference, tiny_inputs) -> None:
    model = from_diffusers(tiny_reference, FastOptions.parse("dtype=float32,sdpa=math,adaln=auto,gelu_epilogue=1"))
    _run(model, tiny_inputs)
    report = model.report()
    assert report["adaln"]["impl"] == "torch" and "CUDA" in report["adaln"]["reason"]
    assert "erf" in report["gelu_epilogue"]
    (entry,) = report["sdpa"]["shapes"].values()
    assert entry == {"requested": "math", "ran": "math", "fallback": "false"}
    assert report["label"] == "sdpa=math,adaln=auto,gelu_epilogue=1,dtype=float32"


def test_block_seam_is_the_same_arithmetic(tiny_reference, tiny_inputs) -> None:
    """With PyTorch's adaLN ops the seam only regroups the same operations: bit for bit the stock output."""
    stock = _run(from_diffusers(tiny_reference, FastOptions(dtype="float32")), tiny_inputs)
    seamed = from_diffusers(tiny_reference, FastOptions(dtype="float32", block_seam=True))
    assert seamed.report()["label"] == "block_seam=1,dtype=float32"
    assert torch.equal(_run(seamed, tiny_inputs), stock)
