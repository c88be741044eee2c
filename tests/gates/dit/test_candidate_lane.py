"""The DiT experiment lane: the candidate of ``dit_impl/fast/candidate.py`` against the frozen baseline.

Quality: the candidate's sampling (its own loop, ``dit_impl/fast/sampler.py``, with its ``SAMPLER``, around the
fast transformer) against the goldens, under the quality contract of the class the run is judged as: what the
sampling executed is recorded (``dit_sampling_trace.py``), and a changed step count, timesteps, guided calls or
blocks per call make it ``approximate`` whatever was claimed; an approximate run is judged on its final latents
and images (on the random-weight cases on their shapes, finiteness and determinism only: the contract's
``[structural]`` table). Speed: the candidate's transformer forward against the diffusers baseline's forward, and
its whole sampling of a case against the baseline's, interleaved in the same run (``ditbench.pair``); the lane's
verdict compares those ratios with the lane's best. On the CPU the ``tiny`` configuration runs; on a GPU
with bf16 also DiT-XL/2 (batch 16 with CFG, 256 tokens).
"""

from __future__ import annotations

import pytest

from dit_gate_support import (WEIGHTS_SEED, XL_ACTIVATION_IMAGES, XL_ACTIVATION_TOKENS, case_sampling, fast_module,
                              full_fp32, latent_kinds, shapes_model, shapes_tensors)
from dit_sampling_trace import executed, frozen, traced
from pytest_ditgate.errors import GateFailure
from pytest_ditgate.verdict.lane import LANE_BEST_LABEL

#: what every candidate must produce; block activations are optional diagnostics (a CUDA graph replay or a
#: compiled block runs no forward hooks): a candidate without them is judged on the rest, and the golden
#: store's summary lists what was not compared
REQUIRED_OUTPUTS = ("latents", "images")
OPTIONAL_OUTPUTS = ("block*",)
#: an approximate run is judged on its final latents and images only (its steps are not the baseline's)
APPROXIMATE_OPTIONAL = ("block*", "step*")
#: the corpus cases whose whole sampling is timed against the baseline's (an approximate change shows there)
TINY_TIMED_CASE, XL_TIMED_CASE = "tiny-ddim-8", "xl-ddim-10"
XL = pytest.mark.requires_gpu(bf16=True, min_memory_gb=20, why="DiT-XL/2 candidate")

_cache: dict[tuple, object] = {}


def candidate_model(baseline, device_type: str, options=None):
    """The baseline ``DitModel`` with its transformer replaced by the fast one (built once per options)."""
    from dit_impl.fast.candidate import options_for
    from dit_impl.fast.sampling import fast_model

    options = options or options_for(device_type)
    key = ("candidate", baseline.config.name, device_type, options)
    if key not in _cache:
        _cache[key] = fast_model(baseline, options)
    return _cache[key]


#: a bf16 XL forward (28 blocks) is compared with its baseline by the lane's quality contract against the
#: goldens (test_xl_candidate_quality), not by one op's bf16 tolerance: its pairs skip ditbench.pair's
#: agreement check (the fp32 tiny forward on the CPU keeps it)
BF16_FORWARD = {"verify": False}


def candidate_sampler():
    """The candidate's ``SAMPLER`` (a candidate module written before it existed samples as the baseline)."""
    from dit_impl.fast import candidate
    from dit_impl.fast.sampler import SamplerOptions

    return getattr(candidate, "SAMPLER", None) or SamplerOptions()


def versus_lane_best(ditbench, ditgate_lane, baseline, device_type: str, args, case) -> None:
    """Re-measure the lane's best configuration side by side with the candidate (no winner's curse): its
    forward, and its sampling of ``case``."""
    from dit_impl.fast.candidate import options_for
    from dit_impl.fast.options import FastOptions
    from dit_impl.fast.sampler import SamplerOptions

    sampler = candidate_sampler()
    ditgate_lane.record_config({"fast_options": options_for("cuda").label(), "sampler": sampler.label()})
    recorded = (ditgate_lane.best_config or {}).get("fast_options")
    if recorded is None:
        pytest.skip("no lane best with a recorded configuration to re-measure yet")
    best_options = FastOptions.parse(recorded)
    if device_type != "cuda":
        best_options = best_options.replace(dtype="float32", cuda_graphs=False, gelu_epilogue=False,
                                            adaln="torch", compile="off", sdpa="math", tf32=False, fp8_emulate=True)
    best_sampler = SamplerOptions.parse((ditgate_lane.best_config or {}).get("sampler") or "default")
    best = candidate_model(baseline, device_type, best_options)
    model = candidate_model(baseline, device_type)
    timing = {"mechanism": "events", "budget_ms": 1500, **BF16_FORWARD} if device_type == "cuda" else {}
    ditbench.pair(forward(model.transformer), forward(best.transformer), *args, min_speedup=None,
                  labels=("candidate", LANE_BEST_LABEL), **timing)
    ditbench.pair(sampling(model, case, sampler), sampling(best, case, best_sampler), min_speedup=None,
                  labels=("candidate sampling", LANE_BEST_LABEL), **timing)


def xl_baseline():
    from dit_impl.baseline import load_model

    key = ("baseline", "dit-xl-2-256")
    if key not in _cache:
        _cache[key] = load_model("dit-xl-2-256", seed=WEIGHTS_SEED, dtype="bfloat16", device="cuda")
    return _cache[key]


def sample_case(model, case, kwargs=None):
    """The candidate's sampling of ``case`` (its own loop and ``SAMPLER``), float32 matmuls without TF32 unless
    the candidate's forward switches it on; (result, what executed)."""
    from dit_impl.fast.sampler import sample

    module = fast_module(model.transformer)
    kwargs = kwargs or case.sample_kwargs()
    watched, trace, unhook = traced(model, module)
    try:
        with full_fp32():
            result = sample(watched, **kwargs, options=candidate_sampler())
    finally:
        unhook()
    return result, trace


def judge(case, model, golden, quality_gate, ditgate_candidate, device: str, *, recorded=None, labels=None,
          **tensor_opts) -> None:
    """Sample ``case`` with the candidate and judge it against the goldens under the class it is judged as.

    ``recorded`` picks the tensors a case keeps from a sampling result (default ``result.tensors``);
    ``labels`` let the learned metrics judge the images (the trained shapes cases).

    ``exact`` is bitwise against the goldens frozen on THIS machine (``ditgate baseline`` writes them:
    under freeze, every run also freezes them); every other class uses the original frozen baseline's
    goldens of this device kind under the contract. Block activations are optional diagnostics. What the
    sampling executed is declared with the candidate: a changed sampling is ``approximate`` whatever was
    claimed, and is judged on the final latents and images (and, where the contract judges a case on its
    structure only, on being deterministic). Float32 outputs of a forward that ran TF32 are held to TF32's
    limits (the judge goes by the matmuls it observed)."""
    module = fast_module(model.transformer)
    kwargs = case.sample_kwargs()
    if module is not model.transformer:  # a CUDA graph replay runs no block hooks
        kwargs["record_blocks"] = ()
    result, trace = sample_case(model, case, kwargs)
    info = result.info
    ditgate_candidate.declare(module, sampling={"num_steps": info["steps"], "scheduler": info["scheduler"],
                                                "guidance_scale": info["guidance_scale"],
                                                **executed(trace, len(kwargs["class_labels"]))},
                              frozen_sampling={**case_sampling(case), **frozen(case, len(module.transformer_blocks))})
    experiment_class = quality_gate.experiment_class
    tensors = recorded(result) if recorded else result.tensors(**tensor_opts)
    assert all(name in tensors for name in REQUIRED_OUTPUTS)
    optional = OPTIONAL_OUTPUTS
    if experiment_class == "approximate":
        tensors, optional = {name: tensors[name] for name in REQUIRED_OUTPUTS}, APPROXIMATE_OPTIONAL
        if quality_gate.contract.structure_only(experiment_class, case.name):
            again, _ = sample_case(model, case, kwargs)
            if not all(again.tensors()[name].equal(result.tensors()[name]) for name in REQUIRED_OUTPUTS):
                raise GateFailure("nondeterministic", f"{case.name}: two samplings of the approximate candidate "
                                  "differ; a case judged on its structure only must at least be deterministic")
    compute_dtype = ("tf32" if device == "cuda" and trace.tf32 and all(t.dtype == _float32() for t in tensors.values())
                     else None)

    def compare_as(experiment_class):
        def compare(candidate, hit):
            __tracebackhide__ = True
            baseline = {name: hit.tensors[name] for name in candidate if name in hit.tensors}
            return quality_gate.check(case.name, candidate, baseline, tolerance_scale=hit.tolerance_scale,
                                      experiment_class=experiment_class, labels=labels, compute_dtype=compute_dtype,
                                      kinds=latent_kinds(baseline) if labels is not None else None)
        return compare

    inputs = None if labels is None else {"kinds": latent_kinds(tensors), "labels": labels}  # for the judge, too
    if golden.mode != "check" or experiment_class != "exact":
        # the original frozen baseline (a bitwise claim against another machine's golden means nothing)
        judged_as = "numerical" if experiment_class == "exact" else experiment_class
        outcome = golden.check(case.name, tensors, device=device, compare=compare_as(judged_as),
                               optional=optional, quality_inputs=inputs)
        assert outcome.status in ("matched", "written"), f"no golden to judge the candidate by ({outcome.status})"
    if golden.mode != "check" or experiment_class == "exact":
        outcome = golden.check(case.name, tensors, device=golden.machine_key(device), compare=compare_as("exact"),
                               optional=optional, quality_inputs=inputs)
        assert outcome.status in ("matched", "written"), f"no golden to judge the candidate by ({outcome.status})"


def _float32():
    import torch

    return torch.float32


def forward_inputs(config, batch: int, device: str, dtype):
    import torch

    g = torch.Generator("cpu").manual_seed(1234)
    x = torch.randn(batch, config.latent_channels, config.latent_size, config.latent_size, generator=g)
    t = torch.randint(0, 1000, (batch,), generator=g)
    y = torch.randint(0, 1000, (batch,), generator=g)
    return x.to(device, dtype), t.to(device), y.to(device)


def forward(transformer):
    def run(x, t, y):
        return transformer(x, timestep=t, class_labels=y).sample

    return run


def sampling(model, case, options=None):
    """A whole sampling of ``case`` with the fast model and ``options`` (the candidate's sampler), to time (TF32
    off outside the forward, as the quality tests sample)."""
    import torch

    from dit_impl.fast.sampler import sample

    def run():
        with torch.no_grad(), full_fp32():
            return sample(model, **case.sample_kwargs(), options=options)

    return run


def baseline_sampling(model, case):
    """The frozen baseline's sampling of ``case`` (diffusers' transformer, the baseline's loop), to time."""
    import torch

    from dit_impl.baseline import sample

    def run():
        with torch.no_grad(), full_fp32():
            return sample(model, **case.sample_kwargs())

    return run


def timed_case(name: str):
    from dit_impl.corpus import load_corpus

    return next(case for case in load_corpus() if case.name == name)


def test_tiny_candidate_quality(tiny_case, tiny_model, golden, quality_gate, ditgate_candidate) -> None:
    judge(tiny_case, candidate_model(tiny_model, "cpu"), golden, quality_gate, ditgate_candidate, "cpu")


def test_shapes_candidate_quality(shapes_cpu_case, golden, quality_gate, ditgate_candidate) -> None:
    """The candidate on the trained shapes model: judged on what its images show, too."""
    judge(shapes_cpu_case, candidate_model(shapes_model("float32", "cpu"), "cpu"), golden, quality_gate,
          ditgate_candidate, "cpu", recorded=shapes_tensors, labels=shapes_cpu_case.labels)


@pytest.mark.requires_gpu(bf16=True, why="dit-s-shapes candidate in bf16")
def test_shapes_gpu_candidate_quality(shapes_gpu_case, golden, quality_gate, ditgate_candidate) -> None:
    judge(shapes_gpu_case, candidate_model(shapes_model("bfloat16", "cuda"), "cuda"), golden, quality_gate,
          ditgate_candidate, "cuda", recorded=shapes_tensors, labels=shapes_gpu_case.labels)


def test_tiny_candidate_forward_speed(tiny_model, ditbench) -> None:
    import torch

    model = candidate_model(tiny_model, "cpu")
    with torch.no_grad():
        args = forward_inputs(tiny_model.config, 16, "cpu", torch.float32)
        ditbench.pair(forward(model.transformer), forward(tiny_model.transformer), *args, min_speedup=None,
                      labels=("candidate", "diffusers"))


def test_tiny_candidate_sampling_speed(tiny_model, ditbench) -> None:
    """A whole sampling of a case, the candidate's against the baseline's: where fewer steps, a guidance cutoff
    or a block cache (approximate) gain what a forward cannot show."""
    case = timed_case(TINY_TIMED_CASE)
    model = candidate_model(tiny_model, "cpu")
    ditbench.pair(sampling(model, case, candidate_sampler()), baseline_sampling(tiny_model, case), min_speedup=None,
                  labels=("candidate sampling", "baseline sampling"))


def test_tiny_candidate_versus_lane_best(tiny_model, ditbench, ditgate_lane) -> None:
    import torch

    with torch.no_grad():
        versus_lane_best(ditbench, ditgate_lane, tiny_model, "cpu",
                         forward_inputs(tiny_model.config, 16, "cpu", torch.float32), timed_case(TINY_TIMED_CASE))


@XL
def test_xl_candidate_quality(xl_case, golden, quality_gate, ditgate_candidate) -> None:
    judge(xl_case, candidate_model(xl_baseline(), "cuda"), golden, quality_gate, ditgate_candidate, "cuda",
          activation_images=XL_ACTIVATION_IMAGES, activation_tokens=XL_ACTIVATION_TOKENS)


@XL
def test_xl_candidate_forward_speed(ditbench) -> None:
    import torch

    baseline = xl_baseline()
    model = candidate_model(baseline, "cuda")
    with torch.no_grad():
        args = forward_inputs(baseline.config, 16, "cuda", torch.bfloat16)
        ditbench.pair(forward(model.transformer), forward(baseline.transformer), *args, min_speedup=None,
                      mechanism="events", budget_ms=1500, labels=("candidate", "diffusers"), **BF16_FORWARD)


@XL
def test_xl_candidate_sampling_speed(ditbench) -> None:
    baseline = xl_baseline()
    case = timed_case(XL_TIMED_CASE)
    ditbench.pair(sampling(candidate_model(baseline, "cuda"), case, candidate_sampler()),
                  baseline_sampling(baseline, case), min_speedup=None, mechanism="events", budget_ms=3000,
                  labels=("candidate sampling", "baseline sampling"), **BF16_FORWARD)


@XL
def test_xl_candidate_versus_lane_best(ditbench, ditgate_lane) -> None:
    import torch

    baseline = xl_baseline()
    with torch.no_grad():
        versus_lane_best(ditbench, ditgate_lane, baseline, "cuda",
                         forward_inputs(baseline.config, 16, "cuda", torch.bfloat16), timed_case(XL_TIMED_CASE))
