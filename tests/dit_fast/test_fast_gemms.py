"""``gemm=quack``: a block hands its QKV and fc1 + GELU GEMMs to quack where they can run, and says why not;
``gemm=quack_fc1`` hands over fc1 + GELU only.

quack's calls are checked on the CPU through a stand-in with quack's call signature that computes in
PyTorch: the block's arithmetic must be unchanged, and a wrong activation must fail the float32 bound. The
real kernels run in ``test_fast_gpu.py`` and the golden gates (sm_90 with quack-kernels installed).
"""

from __future__ import annotations

import pytest

from pytest_ditgate.quality.metrics import rel_l2

torch = pytest.importorskip("torch")

from dit_impl.fast import FastOptions, from_diffusers  # noqa: E402
from dit_impl.fast import gemms  # noqa: E402


class StandInQuack:
    """``quack.gemm_interface``'s ``gemm`` and ``gemm_act`` as the fast DiT calls them, in PyTorch."""

    def __init__(self, activations: dict | None = None) -> None:
        self.calls: list[tuple] = []
        self.activations = activations or {
            "gelu_tanh_approx": lambda h: torch.nn.functional.gelu(h, approximate="tanh")}

    def gemm(self, a, b, bias=None):
        self.calls.append(("gemm", tuple(a.shape), tuple(b.shape)))
        assert a.dim() == 2 and b.shape[0] == a.shape[1], "B must be (K, N)"
        return torch.addmm(bias, a, b)

    def gemm_act(self, a, b, bias=None, activation=None, store_preact=True):
        self.calls.append(("gemm_act", activation, store_preact))
        assert a.dim() == 2 and b.shape[0] == a.shape[1], "B must be (K, N)"
        pre = torch.addmm(bias, a, b)
        return (pre if store_preact else None), self.activations[activation](pre)


def _out(model, inputs):
    x, t, y = inputs
    with torch.inference_mode():
        return model(x, timestep=t, class_labels=y).sample


def _with_gemms(model, block_gemms):
    for block in model.transformer_blocks:
        block.gemms = block_gemms
    return model


@pytest.mark.parametrize("switches", ["dtype=float32", "dtype=float32,block_seam=1"])
def test_quack_gemms_keep_the_blocks_arithmetic(switches, tiny_reference, tiny_inputs, tiny_expected) -> None:
    stock = _out(from_diffusers(tiny_reference, FastOptions.parse(switches)), tiny_inputs)
    quack = StandInQuack()
    model = _with_gemms(from_diffusers(tiny_reference, FastOptions.parse(switches)),
                        gemms.quack_gemms(quack, "stand-in"))
    out = _out(model, tiny_inputs)
    assert rel_l2(out, stock) < 1e-6
    assert rel_l2(out, tiny_expected) < 1e-5
    layers, tokens = len(model.transformer_blocks), 16
    batch, hidden = tiny_inputs[0].shape[0], model.shape.hidden
    assert quack.calls.count(("gemm", (batch * tokens, hidden), (hidden, 3 * hidden))) == layers
    assert quack.calls.count(("gemm_act", "gelu_tanh_approx", False)) == layers
    assert len(quack.calls) == 2 * layers  # attention-out and fc2 stay in cuBLAS


@pytest.mark.parametrize("switches", ["dtype=float32", "dtype=float32,block_seam=1"])
def test_quack_fc1_hands_over_fc1_only(switches, tiny_reference, tiny_inputs, tiny_expected) -> None:
    """``gemm=quack_fc1``: fc1 + GELU in quack, the fused QKV back in cuBLAS, the arithmetic unchanged."""
    stock = _out(from_diffusers(tiny_reference, FastOptions.parse(switches)), tiny_inputs)
    quack = StandInQuack()
    block_gemms = gemms.quack_gemms(quack, "stand-in", qkv_too=False)
    assert block_gemms.impl == "quack_fc1" and block_gemms.qkv is None
    assert "QKV, attention-out and fc2 in cuBLAS" in block_gemms.reason
    model = _with_gemms(from_diffusers(tiny_reference, FastOptions.parse(switches)), block_gemms)
    out = _out(model, tiny_inputs)
    assert rel_l2(out, stock) < 1e-6
    assert rel_l2(out, tiny_expected) < 1e-5
    assert quack.calls == [("gemm_act", "gelu_tanh_approx", False)] * len(model.transformer_blocks)


def test_a_wrong_activation_in_the_epilogue_is_caught(tiny_reference, tiny_inputs, tiny_expected) -> None:
    """The erf GELU where the DiT's MLP has the tanh one: must fail the float32 bound."""
    erf = StandInQuack({"gelu_tanh_approx": torch.nn.functional.gelu})
    model = _with_gemms(from_diffusers(tiny_reference, FastOptions(dtype="float32")), gemms.quack_gemms(erf, "x"))
    assert rel_l2(_out(model, tiny_inputs), tiny_expected) > 1e-5


def test_three_projections_stay_in_cublas(tiny_reference, tiny_inputs, tiny_expected) -> None:
    quack = StandInQuack()
    block_gemms = gemms.quack_gemms(quack, "stand-in", fused_qkv=False)
    assert block_gemms.qkv is None and "fused_qkv=0" in block_gemms.reason
    options = FastOptions(dtype="float32", fused_qkv=False)
    out = _out(_with_gemms(from_diffusers(tiny_reference, options), block_gemms), tiny_inputs)
    assert rel_l2(out, tiny_expected) < 1e-5
    assert {call[0] for call in quack.calls} == {"gemm_act"}


@pytest.mark.parametrize("library", ["quack", "quack_fc1"])
def test_gemm_quack_on_the_cpu_falls_back_with_its_reason(library, tiny_reference, tiny_inputs, tiny_expected) -> None:
    with pytest.warns(RuntimeWarning, match=f"gemm='{library}' fell back to cuBLAS: quack's GEMMs need CUDA"):
        model = from_diffusers(tiny_reference, FastOptions(dtype="float32", gemm=library))
    report = model.report()
    assert report["gemm"]["impl"] == "cublas" and "CUDA" in report["gemm"]["reason"]
    assert report["label"] == f"gemm={library},dtype=float32"
    assert rel_l2(_out(model, tiny_inputs), tiny_expected) < 1e-5
    with pytest.raises(RuntimeError, match=f"gemm='{library}' fell back to cuBLAS"):
        from_diffusers(tiny_reference, FastOptions(dtype="float32", gemm=library, strict=True))


@pytest.mark.parametrize("library,qkv", [("quack", True), ("quack_fc1", False)])
def test_resolve_hands_over_what_the_switch_names(library, qkv, monkeypatch) -> None:
    """Through ``resolve_gemms`` on a (pretended) Hopper with a stand-in quack installed: ``quack`` hands
    over QKV and fc1, ``quack_fc1`` fc1 only, and the report's ``impl`` is the switch's value."""
    import sys
    import types

    stand_in = StandInQuack()
    module = types.ModuleType("quack")
    module.__version__, module.gemm_interface = "stand-in", stand_in
    monkeypatch.setitem(sys.modules, "quack", module)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    chosen = gemms.resolve_gemms(library, torch.device("cuda"), torch.bfloat16, False)
    assert chosen.impl == library and chosen.fc1_gelu is not None and (chosen.qkv is not None) is qkv
    x, linear = torch.randn(2, 3, 8), torch.nn.Linear(8, 24)
    chosen.fc1_gelu(x, linear)
    if qkv:
        chosen.qkv(x, linear)
    assert [call[0] for call in stand_in.calls] == ["gemm_act"] + (["gemm"] if qkv else [])


def test_the_fall_back_reasons_name_what_is_missing() -> None:
    cuda = torch.device("cuda")  # a device object only: the reasons below are decided before any CUDA call
    assert gemms.resolve_gemms("cublas", cuda, torch.bfloat16, False).reason == "requested"
    assert "float32" in gemms.resolve_gemms("quack", cuda, torch.float32, False).reason
    assert "compiled blocks" in gemms.resolve_gemms("quack", cuda, torch.bfloat16, True).reason
    assert "cpu" in gemms.resolve_gemms("quack", torch.device("cpu"), torch.bfloat16, False).reason
    assert "compiled blocks" in gemms.resolve_gemms("quack_fc1", cuda, torch.bfloat16, True).reason


def test_an_unknown_gemm_library_is_rejected() -> None:
    with pytest.raises(ValueError, match="FastOptions.gemm='cutlass' is not one of cublas, quack, quack_fc1"):
        FastOptions(gemm="cutlass")
    assert FastOptions.parse("gemm=quack").gemm == "quack"
    assert FastOptions.parse("gemm=quack_fc1").gemm == "quack_fc1"
