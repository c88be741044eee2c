"""Golden gates for every switch combination of the fast DiT that claims ``exact`` or ``numerical``.

Each combination of ``FastOptions`` is one parameter (its id is ``FastOptions.label()``) of a
module-scoped model fixture, so a model is built once per combination and judged on every corpus case
of its config: latents per recorded step, decoded images and block activations (where forward
hooks run: no CUDA graph, no compiled blocks), against the ORIGINAL baseline's goldens under the
quality contract of the claimed class. On the CPU the ``tiny`` config runs in float32 (goldens
``cpu``); on a GPU with bf16 DiT-XL/2 runs against the float32 goldens frozen on the same arch
(``sm_90``). A switch that silently fell back (math SDPA, PyTorch adaLN, erf GELU) fails the test:
it would judge a combination that did not run.
The negative controls at the end prove the gate rejects a plausible wrong optimisation.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from dit_gate_support import (WEIGHTS_SEED, XL_ACTIVATION_IMAGES, XL_ACTIVATION_TOKENS, case_sampling, drop_shift,
                              fast_module, full_fp32, unrecorded_contract_compare)
from dit_impl.fast.options import FastOptions
from pytest_ditgate.errors import GateFailure

#: what every candidate must produce; block activations only where forward hooks run (no CUDA graph)
REQUIRED_OUTPUTS = ("latents", "images")
OPTIONAL_OUTPUTS = ("block*",)
XL = pytest.mark.requires_gpu(bf16=True, min_memory_gb=20, why="DiT-XL/2 fast switches")


@dataclass(frozen=True)
class Combo:
    """A switch combination and the experiment class it claims against the frozen baseline."""

    options: FastOptions
    claim: str  # "exact" or "numerical"

    @property
    def label(self) -> str:
        return self.options.label()


def cpu_combos() -> list[Any]:
    """fused_qkv x batched_conditioning x sdpa(auto, math) in float32, plus the CUDA-only switches
    requested on the CPU (they fall back, reported), and the block seam. ``auto`` dispatches to the same CPU SDPA kernel as
    diffusers, so those claim bitwise ``exact``; the math path rounds differently: ``numerical``."""
    combos = []
    for sdpa in ("auto", "math"):
        for fused in (True, False):
            for batched in (True, False):
                options = FastOptions(dtype="float32", sdpa=sdpa, fused_qkv=fused, batched_conditioning=batched)
                combos.append(Combo(options, "exact" if sdpa == "auto" else "numerical"))
    combos.append(Combo(FastOptions(dtype="float32", adaln="auto", gelu_epilogue=True, gemm="quack"), "exact"))
    # the block seam regroups PyTorch's adaLN ops without changing them; its blocks' recorded output is x
    combos.append(Combo(FastOptions(dtype="float32", block_seam=True), "exact"))
    return [pytest.param(c, id=c.label) for c in combos]


def _gpu(text: str, *marks: Any) -> Any:
    combo = Combo(FastOptions.parse(text, FastOptions(dtype="bfloat16")), "numerical")
    return pytest.param(combo, id=combo.label, marks=[XL, *marks])


_KERNELS = pytest.mark.requires_gpu(nvcc=True, why="adaln=kernels JIT-builds the fused kernels")
_COMPILE = pytest.mark.requires_gpu(triton=True, why="compile=blocks needs inductor's triton backend")
_QUACK = pytest.mark.requires_gpu(cc=">=9.0", packages="quack-kernels>=0.6.5", why="gemm=quack's Hopper GEMMs")
#: DiT-XL/2 combinations in bf16 (and one in fp16, beside the baseline's bf16 VAE, as the lane runs it: the
#: candidate's sampler hands the VAE its own dtype), all claiming ``numerical``
GPU_COMBOS = [
    _gpu("default"),
    _gpu("dtype=float16"),
    _gpu("sdpa=flash", pytest.mark.requires_gpu(sdpa="flash")),
    _gpu("sdpa=cudnn", pytest.mark.requires_gpu(sdpa="cudnn")),
    _gpu("sdpa=efficient", pytest.mark.requires_gpu(sdpa="efficient")),
    _gpu("fused_qkv=0,batched_conditioning=0"),
    _gpu("gelu_epilogue=1"),
    _gpu("adaln=kernels", _KERNELS),
    _gpu("cuda_graphs=1"),
    _gpu("compile=blocks", _COMPILE),
    # dit_bench's sampling configuration and its fastest forward (8.04 ms on the H200)
    _gpu("compile=blocks,cuda_graphs=1,gelu_epilogue=1,sdpa=cudnn", _COMPILE, pytest.mark.requires_gpu(sdpa="cudnn")),
    _gpu("cuda_graphs=1,gelu_epilogue=1,adaln=kernels,sdpa=cudnn", _KERNELS, pytest.mark.requires_gpu(sdpa="cudnn")),
    _gpu("adaln=kernels,block_seam=1", _KERNELS),  # eager: its block activations are judged too
    _gpu("cuda_graphs=1,gelu_epilogue=1,adaln=kernels,sdpa=cudnn,block_seam=1", _KERNELS,
         pytest.mark.requires_gpu(sdpa="cudnn")),
    # the fastest set with quack's QKV and fc1 + GELU GEMMs (sm_90 or newer, quack-kernels installed)
    _gpu("cuda_graphs=1,adaln=kernels,sdpa=cudnn,block_seam=1,gemm=quack", _KERNELS, _QUACK,
         pytest.mark.requires_gpu(sdpa="cudnn")),
    # the same with quack's fc1 + GELU only (QKV back in cuBLAS; a switch value, slower than the set above)
    _gpu("cuda_graphs=1,adaln=kernels,sdpa=cudnn,block_seam=1,gemm=quack_fc1", _KERNELS, _QUACK,
         pytest.mark.requires_gpu(sdpa="cudnn")),
]


def assert_switches_ran(model: Any, options: FastOptions, device_type: str) -> None:
    """The combination judged is the one named: no silent fall-back of a switch that can run here."""
    report = fast_module(model.transformer).report()
    if options.sdpa != "auto" or device_type == "cuda":
        assert report["sdpa"]["shapes"] and not report["sdpa"]["fallback"], f"SDPA fell back: {report['sdpa']}"
    if device_type == "cuda":
        if options.adaln == "kernels":
            assert report["adaln"]["impl"] == "kernels", f"adaln=kernels did not run: {report['adaln']['reason']}"
        if options.gelu_epilogue and options.gemm == "cublas":
            assert report["gelu_epilogue"].startswith("cuBLASLt"), report["gelu_epilogue"]
        assert report["gemm"]["impl"] == options.gemm, f"gemm={options.gemm} did not run: {report['gemm']['reason']}"
    else:  # the CUDA-only switches must say that they fell back on the CPU
        if options.adaln != "torch":
            assert report["adaln"]["impl"] == "torch" and "CUDA" in report["adaln"]["reason"]
        if options.gelu_epilogue:
            assert report["gelu_epilogue"].startswith("ignored on cpu"), report["gelu_epilogue"]
        if options.gemm != "cublas":
            assert report["gemm"]["impl"] == "cublas" and "CUDA" in report["gemm"]["reason"], report["gemm"]


def hooks_run(options: FastOptions) -> bool:
    """Whether block forward hooks (activation recording) run as in eager mode: a CUDA graph replay runs
    none, and a hook on a compiled block is traced into it (guarding on the recording step: a recompile
    per step), so those combinations are judged on latents and images only."""
    return not options.cuda_graphs and options.compile == "off"


def judge(case: Any, model: Any, combo: Combo, golden: Any, quality_gate: Any, ditgate_candidate: Any,
          device: str, *, baseline: Any = None, **tensor_opts: Any) -> None:
    """Sample ``case`` with the fast ``model`` and judge it against the golden under ``combo.claim``.

    Every combination is judged against the ORIGINAL baseline's golden of this device kind (``numerical``
    for an ``exact`` claim: the golden may come from another machine). An ``exact`` claim is in addition
    judged bitwise against the frozen baseline implementation (``baseline``) sampled on this machine.
    Block activations are optional where hooks do not run (CUDA graph replay, compiled blocks). The candidate's
    sampler at its defaults is the baseline's loop (bitwise), with latents reaching the VAE in its dtype."""
    from dit_impl.fast.sampler import sample

    ditgate_candidate.declare(fast_module(model.transformer), sampling=case_sampling(case),
                              frozen_sampling=case_sampling(case))
    hooks = hooks_run(combo.options)
    kwargs = case.sample_kwargs()
    if not hooks:
        kwargs["record_blocks"] = ()
    with full_fp32():
        tensors = sample(model, **kwargs).tensors(**tensor_opts)
    assert all(name in tensors for name in REQUIRED_OUTPUTS)
    assert_switches_ran(model, combo.options, model.device.type)

    def compare_as(experiment_class: str) -> Any:
        def compare(candidate: Any, hit: Any) -> Any:
            __tracebackhide__ = True
            return quality_gate.check(case.name, candidate, hit.tensors, tolerance_scale=hit.tolerance_scale,
                                      experiment_class=experiment_class)
        return compare

    outcome = golden.check(case.name, tensors, device=device, compare=compare_as("numerical"),
                           optional=() if hooks else OPTIONAL_OUTPUTS)
    assert outcome.status == "matched", f"no golden to judge {combo.label} by ({outcome.status})"
    if combo.claim == "exact":
        reference = baseline_on_this_machine(case, baseline, kwargs, tensor_opts)
        assert set(reference) == set(tensors), f"{combo.label}: {sorted(set(reference) ^ set(tensors))}"
        quality_gate.check(case.name, tensors, reference, experiment_class="exact")


_reference_runs: dict[tuple, Any] = {}


def baseline_on_this_machine(case: Any, model: Any, kwargs: dict, tensor_opts: dict) -> dict:
    """The frozen baseline implementation's tensors for ``case`` on this machine (what ``exact`` means
    here: a bitwise claim against outputs from another machine's CPU or GPU means nothing)."""
    from dit_impl.baseline import sample as baseline_sample

    key = (case.name, id(model), repr(sorted(kwargs.items())), repr(sorted(tensor_opts.items())))
    if key not in _reference_runs:
        with full_fp32():
            _reference_runs[key] = baseline_sample(model, **kwargs).tensors(**tensor_opts)
    return _reference_runs[key]


# -- CPU: the tiny config, every CPU-valid combination ------------------------------------------------

@pytest.fixture(scope="module", params=cpu_combos())
def tiny_fast(request: pytest.FixtureRequest, tiny_model: Any) -> tuple[Combo, Any]:
    from dit_impl.fast.sampling import fast_model

    combo = request.param
    return combo, fast_model(tiny_model, combo.options)


def test_tiny_switches_match_goldens(tiny_case, tiny_fast, tiny_model, golden, quality_gate,
                                     ditgate_candidate) -> None:
    combo, model = tiny_fast
    if golden.mode != "check":
        pytest.skip("judges a candidate against existing goldens; nothing to judge while freezing")
    judge(tiny_case, model, combo, golden, quality_gate, ditgate_candidate, "cpu", baseline=tiny_model)


# -- GPU: DiT-XL/2 in bf16 (fp16) against the float32 goldens of this arch ---------------------------

_baselines: dict[str, Any] = {}


def xl_baseline(dtype: str) -> Any:
    """The XL/2 baseline (random weights, the goldens' seed) in ``dtype``; one dtype resident at a time."""
    from dit_impl.baseline import load_model

    if dtype not in _baselines:
        _baselines.clear()
        _baselines[dtype] = load_model("dit-xl-2-256", seed=WEIGHTS_SEED, dtype=dtype, device="cuda")
    return _baselines[dtype]


@pytest.fixture(scope="module", params=GPU_COMBOS)
def xl_fast(request: pytest.FixtureRequest):
    import torch

    from dit_impl.fast.sampling import fast_model

    combo = request.param
    vae_dtype = "bfloat16" if combo.options.dtype == "float16" else combo.options.dtype  # the lane's VAE
    held = {"model": fast_model(xl_baseline(vae_dtype), combo.options)}
    yield combo, held
    held.clear()  # the next combination's model (and its CUDA graphs) must not sit beside this one
    torch.cuda.empty_cache()


def test_xl_switches_match_goldens(xl_case, xl_fast, golden, quality_gate, ditgate_candidate) -> None:
    combo, held = xl_fast
    model = held["model"]
    if golden.mode != "check":
        pytest.skip("judges a candidate against existing goldens; nothing to judge while freezing")
    judge(xl_case, model, combo, golden, quality_gate, ditgate_candidate, "cuda",
          activation_images=XL_ACTIVATION_IMAGES, activation_tokens=XL_ACTIVATION_TOKENS)


# -- negative controls: a wrong optimisation behind the same switches must be rejected by the gate ----

def _ungate_residual(monkeypatch: pytest.MonkeyPatch) -> None:
    """The residual added without its adaLN-Zero gate (``x + y``)."""
    from dit_impl.fast import adaln

    monkeypatch.setattr(adaln, "gated_residual", lambda x, gate, y: x + y)


def _erf_gelu(monkeypatch: pytest.MonkeyPatch, model: Any) -> None:
    """The MLP's GELU(tanh) replaced by the erf GELU (what the CPU's fused addmm epilogue computes)."""
    for block in fast_module(model.transformer).transformer_blocks:
        monkeypatch.setattr(block, "gelu_epilogue", True)


FAULTS = {"dropped_shift": drop_shift, "ungated_residual": _ungate_residual}


def _assert_rejected(case: Any, model: Any, golden: Any, quality_gate: Any, claim: str, device: str,
                     baseline: Any = None, **tensor_opts: Any) -> GateFailure:
    """The faulty ``model`` fails ``claim``: against the golden, or (``exact``) bitwise against the frozen
    baseline implementation sampled on this machine."""
    from dit_impl.fast.sampling import sample

    kwargs = case.sample_kwargs()
    if not hooks_run(fast_module(model.transformer).options):
        kwargs["record_blocks"] = ()
    with full_fp32():
        tensors = sample(model, **kwargs).tensors(**tensor_opts)
    compare = unrecorded_contract_compare(quality_gate.contract, case.name, experiment_class=claim)
    with pytest.raises(GateFailure) as info:
        if claim == "exact":
            reference = baseline_on_this_machine(case, baseline, kwargs, tensor_opts)
            judged = compare(tensors, SimpleNamespace(tensors=reference, tolerance_scale=1.0))
            if not judged.passed:
                raise GateFailure("golden_mismatch", f"{case.name}: the frozen baseline on this machine does not "
                                                     "match:\n  " + "\n  ".join(judged.lines()))
        else:
            golden.check(case.name, tensors, device=device, compare=compare, optional=OPTIONAL_OUTPUTS)
    assert info.value.reason == "golden_mismatch"
    assert "FAIL" in str(info.value) and case.name in str(info.value)
    return info.value


#: fault -> the class whose contract must reject it. The erf GELU moves tiny's latents by a relative L2
#: of about 5e-5, inside the float32 ``numerical`` limit (1e-4): only an ``exact`` claim (which the
#: default CPU combination makes) can catch it, so that is the claim it is judged under.
FAULT_CLAIMS = {"dropped_shift": "numerical", "ungated_residual": "numerical", "erf_gelu": "exact"}


@pytest.mark.parametrize("fault", list(FAULT_CLAIMS))
def test_gate_rejects_a_wrong_fast_optimisation(fault, monkeypatch, dit_corpus, tiny_model, golden,
                                                quality_gate) -> None:
    """Negative control: each fault, in the default CPU combination, fails the contract of its class."""
    if golden.mode != "check":
        pytest.skip("negative control compares with existing goldens; nothing to check while freezing")
    from dit_impl.fast.sampling import fast_model

    case = next(c for c in dit_corpus if c.config == "tiny")
    model = fast_model(tiny_model, FastOptions(dtype="float32"))
    if fault == "erf_gelu":
        _erf_gelu(monkeypatch, model)
    else:
        FAULTS[fault](monkeypatch)
    failure = _assert_rejected(case, model, golden, quality_gate, FAULT_CLAIMS[fault], "cpu", baseline=tiny_model)
    assert "FAIL latents" in str(failure)


@XL
@pytest.mark.requires_gpu(sdpa="cudnn", why="DiT-XL/2 negative control (cuDNN SDPA)")
def test_xl_gate_rejects_a_dropped_shift(monkeypatch, dit_corpus, golden, quality_gate) -> None:
    """Negative control on the GPU: bf16's looser ``numerical`` limits still reject a dropped shift term
    in a fast combination (CUDA graph, GELU epilogue, cuDNN SDPA; PyTorch adaLN, where the fault sits)."""
    if golden.mode != "check":
        pytest.skip("negative control compares with existing goldens; nothing to check while freezing")
    from dit_impl.fast.sampling import fast_model

    case = next(c for c in dit_corpus if c.config == "dit-xl-2-256")
    # adaln=torch: the monkeypatched PyTorch op is what runs (the fused kernels would bypass it)
    options = FastOptions.parse("cuda_graphs=1,gelu_epilogue=1,sdpa=cudnn", FastOptions(dtype="bfloat16"))
    drop_shift(monkeypatch)
    model = fast_model(xl_baseline("bfloat16"), options)
    failure = _assert_rejected(case, model, golden, quality_gate, "numerical", "cuda",
                               activation_images=XL_ACTIVATION_IMAGES, activation_tokens=XL_ACTIVATION_TOKENS)
    assert "FAIL latents" in str(failure)  # the required outputs fail, not the missing block activations
