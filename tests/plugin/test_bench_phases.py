"""Phase profiling without a GPU: the classification table rule by rule on kernel names seen in real
torch.profiler traces (cuBLAS, cuDNN, FlashAttention, CUTLASS, inductor), the summary of synthetic
Chrome traces (overlaps, idle gaps, FLOP and byte rates against peaks, host self time), device-profile
peaks, the terminal lines and the report section."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_ditgate.bench.phases import PHASES, RULES, classify, matching_rule
from pytest_ditgate.bench.profiling import (PhaseProfile, activities_from_trace, self_spans, summarize_trace,
                                            unavailable)
from pytest_ditgate.bench.report import profile_lines, profile_row
from pytest_ditgate.errors import ProfileError
from pytest_ditgate.profiles import peaks_for, read_profile

# (name as the profiler reports it, phase, the rule index that must decide it)
REAL_NAMES = [
    # copy-engine work, as kineto names it
    ("Memcpy DtoD (Device -> Device)", "copy", 0),
    ("Memcpy DtoH (Device -> Pinned)", "copy", 0),
    ("Memcpy HtoD (Pageable -> Device)", "copy", 0),
    ("Memset (Device)", "copy", 0),
    # inductor pointwise / reduction kernels named after fused GEMMs: epilogues, not GEMMs
    ("triton_poi_fused_addmm_mul_silu_view_1", "elementwise", 1),
    ("triton_per_fused_addmm_mean_relu_2", "elementwise", 1),
    ("triton_red_fused_native_layer_norm_0", "elementwise", 1),
    # fused attention (before GEMM: these are built from GEMM pieces)
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_kernel0_0", "attention", 2),
    ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t, "
     "cutlass::arch::Sm80, true, 64, 128, 128, true, true>::Params)", "attention", 2),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
     "cutlass::bfloat16_t>, false, false, false, false, true, true, false, false>(Flash_fwd_params)", "attention", 2),
    ("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::"
     "CollectiveMainloopFwdSm90<2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> > > > > >", "attention", 2),
    # GEMMs: cuBLAS on Hopper (nvjet, xmma), Ampere kernels, cuDNN implicit-GEMM convolution, gemv, templates
    ("nvjet_tst_128x24_64x11_2x1_v_bz_TNT", "gemm", 3),
    ("nvjet_tst_64x24_64x16_4x1_v_bz_splitK_TNT", "gemm", 3),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_"
     "kernel__5x_cublas", "gemm", 3),
    ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x3_tn", "gemm", 3),
    ("ampere_sgemm_128x64_tn", "gemm", 3),
    ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_warpgroupsize1x1x1_g1_"
     "execute_segment_k_off_kernel__5x_cudnn", "gemm", 3),
    ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4>(cutlass_80_tensorop_s1688gemm_"
     "64x64_16x6_tn_align4::Params)", "gemm", 3),
    ("void reduce_1Block_kernel<float, 128, 7, cublasGemvTensorStridedBatched<float>, "
     "cublasGemvTensorStridedBatched<float>, cublasGemvTensorStridedBatched<float> >", "gemm", 3),
    ("triton_tem_fused_addmm_native_layer_norm_view_1", "gemm", 3),
    ("aten::addmm", "gemm", 3),
    ("aten::mm", "gemm", 3),
    # normalisation and elementwise: torch, vLLM and this repository's own kernels
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, false>"
     "(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, "
     "c10::BFloat16*)", "elementwise", 4),
    ("void vllm::rms_norm_kernel<c10::BFloat16>(c10::BFloat16*, c10::BFloat16 const*, c10::BFloat16 const*, "
     "float, int, int)", "elementwise", 4),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
     "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)",
     "elementwise", 4),
    ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::"
     "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const>", "elementwise", 4),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::"
     "(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)", "elementwise", 4),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, "
     "float, float>, unsigned int, float, 4, 4> >", "elementwise", 4),
    ("void at::native::(anonymous namespace)::indexSelectSmallIndex<c10::BFloat16, long, unsigned int, 2, 2, -2>",
     "elementwise", 4),
    ("adaln_warp_kernel", "elementwise", 4),
    ("gated_residual_vec_kernel", "elementwise", 4),
    ("aten::native_layer_norm", "elementwise", 4),
    # nothing above
    ("void vllm::moe::count_and_sort_expert_tokens_kernel<int>(int const*, int*, int*, unsigned long)", "other", None),
    ("aten::empty_strided", "other", None),
]


@pytest.mark.parametrize("name,phase,rule", REAL_NAMES, ids=[n[:48] for n, _, _ in REAL_NAMES])
def test_real_kernel_names_fall_in_their_phase_by_the_intended_rule(name: str, phase: str, rule: int | None) -> None:
    assert classify(name) == phase
    assert matching_rule(name) is (None if rule is None else RULES[rule])


def test_every_rule_is_exercised_and_names_a_known_phase() -> None:
    used = {rule for _, _, rule in REAL_NAMES if rule is not None}
    assert used == set(range(len(RULES)))
    assert {r.phase for r in RULES} | {"other", "idle"} == set(PHASES)


# ---- synthetic traces ----------------------------------------------------------------------------------

def kernel(name: str, ts: float, dur: float, *, op: int | None = None, cat: str = "kernel", **args) -> dict:
    args = dict(args, **({"External id": op} if op is not None else {}))
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur, "args": args}


GEMM = "nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNT"
SDPA = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_kernel0_0"
PEAKS = {"tflops": {"bf16": 800.0}, "gbps": 4000.0, "source": "test", "profile": "test"}


def device_trace() -> dict:
    # us: GEMM 0-100 (op 1: 80 GFLOP bf16) | gap 100-110 | SDPA 110-150 overlapping a layer norm 140-160 on
    # another stream | gap 160-170 | memcpy DtoD 170-180 (20 MB) | split-K reduce of op 1 at 180-185
    return {"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ditgate::profile", "tid": 1, "ts": -50.0, "dur": 400.0},
        kernel(GEMM, 0.0, 100.0, op=1),
        kernel(SDPA, 110.0, 40.0, op=2),
        kernel("void at::native::vectorized_layer_norm_kernel<float>", 140.0, 20.0, op=3),
        kernel("Memcpy DtoD (Device -> Device)", 170.0, 10.0, cat="gpu_memcpy", bytes=20_000_000),
        kernel("void splitKreduce_kernel<32, 16, int, float, float>", 180.0, 5.0, op=1),
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "tid": 1, "ts": -40.0, "dur": 5.0, "args": {"External id": 1}},
        {"ph": "f", "name": "ac2g"}, "not an event",
    ]}


def test_device_trace_splits_busy_time_by_phase_with_idle_gaps_and_shared_overlap() -> None:
    profile = summarize_trace(device_trace(), {1: (80_000_000_000, "bf16")}, label="fwd", peaks=PEAKS,
                              device="NVIDIA H200", arch="sm_90")
    assert profile.source == "device" and profile.activities == 5
    assert profile.span_ms == pytest.approx(0.185) and profile.busy_ms == pytest.approx(0.165)
    ms = {phase: profile.phases[phase]["ms"] * 1000 for phase in PHASES}  # in us
    # 140-150: SDPA and the layer norm overlap, 5 us each
    assert ms == pytest.approx({"gemm": 105.0, "attention": 35.0, "elementwise": 15.0, "copy": 10.0, "other": 0.0,
                                "idle": 20.0})
    assert sum(p["share"] for p in profile.phases.values()) == pytest.approx(1.0)
    top = {k["name"]: k for k in profile.kernels}
    assert [k["name"] for k in profile.kernels][0] == GEMM
    # the op's FLOPs go to its longest kernel: 80 GFLOP in 100 us = 800 TFLOP/s = 100 % of the bf16 peak
    assert top[GEMM]["tflops"] == pytest.approx(800.0) and top[GEMM]["tflops_fraction"] == pytest.approx(1.0)
    assert "flops" not in top["void splitKreduce_kernel<32, 16, int, float, float>"]
    assert "tflops" not in top[SDPA]  # no FLOP count reported: none invented
    # a device-to-device copy reads and writes: 40 MB in 10 us = 4000 GB/s, the copy peak
    copy = top["Memcpy DtoD (Device -> Device)"]
    assert copy["gbps"] == pytest.approx(4000.0) and copy["gbps_fraction"] == pytest.approx(1.0)
    assert profile.gemm["coverage"] == pytest.approx(100 / 105) and profile.gemm["peak_fraction"] == pytest.approx(1.0)


def test_without_peaks_rates_are_absolute_and_the_profile_says_so() -> None:
    note = "no device profile with measured peaks describes X: rates are absolute"
    profile = summarize_trace(device_trace(), {1: (80_000_000_000, "bf16")}, label="fwd", peaks_note=note)
    assert all("tflops_fraction" not in k and "gbps_fraction" not in k for k in profile.kernels)
    assert profile.peaks is None
    assert profile.kernels[0]["tflops"] == pytest.approx(800.0) and note in profile.notes
    host_to_device = {"traceEvents": [kernel("Memcpy HtoD (Pageable -> Device)", 0.0, 10.0, cat="gpu_memcpy",
                                             bytes=1_000_000)]}
    (row,) = summarize_trace(host_to_device, label="h2d", peaks=PEAKS).kernels
    assert row["gbps"] == pytest.approx(100.0) and "gbps_fraction" not in row  # a link, not device memory


def test_host_trace_gives_each_op_its_self_time_and_python_time_as_idle() -> None:
    trace = {"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ditgate::profile", "tid": 1, "ts": 0.0, "dur": 100.0},
        kernel("aten::linear", 10.0, 50.0, op=5),
        kernel("aten::addmm", 15.0, 40.0, op=6),
        kernel("aten::gelu", 70.0, 20.0, op=7),
        kernel("aten::mm", 200.0, 10.0, op=8),  # outside the profiled call
    ]}
    for event in trace["traceEvents"][1:]:
        event.update(cat="cpu_op", tid=1)
    profile = summarize_trace(trace, {6: (4_000_000_000, "fp32")}, label="mlp")
    assert profile.source == "host" and profile.span_ms == pytest.approx(0.1)
    ms = {phase: round(profile.phases[phase]["ms"] * 1000, 6) for phase in PHASES}
    assert ms == {"gemm": 50.0, "attention": 0.0, "elementwise": 20.0, "copy": 0.0, "other": 0.0, "idle": 30.0}
    addmm = next(k for k in profile.kernels if k["name"] == "aten::addmm")
    assert addmm["ms"] == pytest.approx(0.04) and addmm["tflops"] == pytest.approx(100.0) and addmm["dtype"] == "fp32"
    assert any("host ops' self time" in note for note in profile.notes)


def test_self_spans_of_nested_and_overreaching_ops() -> None:
    # parent 0-100 with children 10-20 and 30-120 (reaches past the parent: cut at 100), grandchild 40-50
    spans = self_spans([(0, 100), (10, 20), (30, 120), (40, 50)])
    assert spans == [[(0, 10), (20, 30)], [(10, 20)], [(30, 40), (50, 100)], [(40, 50)]]


def test_empty_or_unusable_traces_say_so() -> None:
    assert activities_from_trace({"traceEvents": []}) == ("none", [], None)
    bad_times = {"traceEvents": [kernel(GEMM, float("nan"), 1.0), kernel(GEMM, 1.0, -1.0), kernel(GEMM, "x", 1.0)]}
    profile = summarize_trace(bad_times, label="x")
    assert profile.source == "none" and "nothing to split" in profile.notes[0]
    down = unavailable("x", "not profiled: profiler unavailable: RuntimeError: busy")
    assert down.source == "unavailable" and PhaseProfile.from_dict(json.loads(json.dumps(down.to_dict()))) == down


def test_profile_round_trips_through_json() -> None:
    profile = summarize_trace(device_trace(), {1: (80_000_000_000, "bf16")}, label="fwd", peaks=PEAKS,
                              trace="profiles/t.json")
    assert PhaseProfile.from_dict(json.loads(json.dumps(profile.to_dict()))) == profile


# ---- device-profile peaks ------------------------------------------------------------------------------

def test_h200_profile_carries_measured_peaks_and_only_it_matches_an_h200() -> None:
    peaks, note = peaks_for("NVIDIA H200", "sm_90")
    assert peaks["tflops"]["bf16"] == 800.0 and peaks["gbps"] > 4000 and peaks["profile"] == "h200"
    assert "measured" in peaks["source"] and "h200" in note
    assert peaks_for("NVIDIA H100 80GB HBM3", "sm_90")[0] is None  # same arch, another GPU: no peaks borrowed
    none, why = peaks_for("NVIDIA RTX A5500", "sm_86")
    assert none is None and "rates are absolute" in why


@pytest.mark.parametrize("peaks,message", [
    ({"tflops": {"bf16": 800}}, "*peaks.source must say where*"),
    ({"source": "m", "tflops": {"int4": 1.0}}, "*peaks.tflops.int4*dtypes are fp64*"),
    ({"source": "m", "tflops": {"bf16": -1}}, "*peaks.tflops.bf16 = -1*"),
    ({"source": "m", "gbps": float("inf")}, "*peaks.gbps must be a positive number*"),
    ({"source": "m", "clock": 1}, "*field 'peaks' must be an object with source*"),
    ("fast", "*field 'peaks' must be*"),
])
def test_bad_peaks_in_a_device_profile_are_refused(tmp_path: Path, peaks, message: str) -> None:
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"name": "My GPU", "arch": "sm_89", "peaks": peaks}))
    with pytest.raises(ProfileError) as info:
        read_profile(str(path))
    assert info.match(message.replace("*", ".*").replace("(", r"\(").replace(")", r"\)"))


def test_a_user_profile_named_by_the_environment_supplies_peaks(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"name": "My GPU", "arch": "sm_89", "match_name": "4090",
                                "peaks": {"source": "my bench", "tflops": {"fp16": 150.0}}}))
    monkeypatch.delenv("DITGATE_DEVICE_PROFILE", raising=False)
    assert peaks_for("NVIDIA GeForce RTX 4090", "sm_89")[0] is None  # no shipped profile measured a 4090
    monkeypatch.setenv("DITGATE_DEVICE_PROFILE", str(path))
    peaks, note = peaks_for("NVIDIA GeForce RTX 4090", "sm_89")
    assert peaks["tflops"] == {"fp16": 150.0} and "my bench" in note
    # read every time: a user's file may change under a session (shipped ones are read once)
    path.write_text(json.dumps({"name": "My GPU", "arch": "sm_89", "match_name": "4090",
                                "peaks": {"source": "my bench, again", "tflops": {"fp16": 160.0}}}))
    assert peaks_for("NVIDIA GeForce RTX 4090", "sm_89")[0]["tflops"] == {"fp16": 160.0}
    assert peaks_for("NVIDIA GeForce RTX 4090", "sm_89", str(path))[0]["tflops"] == {"fp16": 160.0}


def test_the_peaks_a_caller_keeps_do_not_change_the_shipped_profile() -> None:
    peaks, _ = peaks_for("NVIDIA H200", "sm_90")
    peaks["tflops"]["bf16"] = 1.0
    assert peaks_for("NVIDIA H200", "sm_90")[0]["tflops"]["bf16"] == 800.0


# ---- terminal and report -------------------------------------------------------------------------------

def test_terminal_lines_show_a_phase_table_top_kernels_and_the_trace() -> None:
    profile = summarize_trace(device_trace(), {1: (80_000_000_000, "bf16")}, label="fast", peaks=PEAKS,
                              trace="profiles/t.json").to_dict()
    other = unavailable("slow", "not profiled: profiler unavailable: busy").to_dict()
    lines = profile_lines([profile_row("t.py::test_fwd", profile), profile_row("t.py::test_fwd", other),
                           {"kind": "measurement"}])
    text = "\n".join(lines)
    assert lines[0].split() == ["phase", "profile", "source", "traced", "ms", "GEMM", "attention", "norm/elementwise",
                                "memcpy/memset", "other", "idle/traced", "timed", "ms", "idle/timed"]
    assert lines[2].split()[:5] == ["test_fwd[fast]", "device", "0.1850", "56.8%", "18.9%"]
    assert "nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNT: 0.1000 ms x1 GEMM, 800 TFLOP/s (100% of bf16 peak)" in text
    assert "GEMM: 800 TFLOP/s over 95% of GEMM time with known FLOPs, 100% of the bf16 peak" in text
    assert "trace: profiles/t.json" in text and "note: not profiled: profiler unavailable: busy" in text
    assert profile_lines([{"kind": "measurement"}]) == []


def _bench_ledger(root: Path, profiles: list) -> None:
    root.mkdir(parents=True, exist_ok=True)
    record = {"kind": "measurement", "test": "t.py::test_fwd", "measurement": {"label": "fwd", "median_ms": 1.0},
              "profiles": profiles}
    (root / "bench.jsonl").write_text(json.dumps(record) + "\n")


def test_report_withholds_a_gemm_rate_over_too_little_of_the_gemm_time(tmp_path: Path) -> None:
    """The terminal summary and ``ditgate report`` apply the same coverage rule to a phase rate."""
    from pytest_ditgate.verdict.report import build_report

    good = summarize_trace(device_trace(), {1: (80_000_000_000, "bf16")}, label="fwd", peaks=PEAKS).to_dict()
    _bench_ledger(tmp_path, [dict(good, gemm=dict(good["gemm"], coverage=0.2))])
    page = build_report(tmp_path)
    assert "nvjet_tst_128x256" in page.html and "800.0 (100% of bf16 peak)" not in page.html


def test_report_has_a_phase_section_with_bars_or_says_they_were_left_out(tmp_path: Path, monkeypatch) -> None:
    from pytest_ditgate.verdict.report import NO_PHASE_BARS, build_report

    good = summarize_trace(device_trace(), {1: (80_000_000_000, "bf16")}, label="fwd", peaks=PEAKS).to_dict()
    broken = dict(good, phases={"gemm": {"ms": "x"}})
    _bench_ledger(tmp_path, [good, broken, "junk"])
    page = build_report(tmp_path)
    assert "<h2>Phase profiles</h2>" in page.html and "1 phase profiles" in page.html
    assert "nvjet_tst_128x256" in page.html and "800.0 (100% of bf16 peak)" in page.html
    assert any("left out 2 phase profile(s)" in note for note in page.notes)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert NO_PHASE_BARS in page.html
    else:
        assert "alt='phase bars'" in page.html
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    page = build_report(tmp_path)
    assert NO_PHASE_BARS in page.html and "alt='phase bars'" not in page.html
    _bench_ledger(tmp_path, [])
    assert "No phase profiles recorded" in build_report(tmp_path).html
