"""Benchmark: DiT-XL/2 transformer forward (and optionally full sampling), baseline vs fast, in ONE run.

Random DiT-XL/2 weights (diffusers layout), batch 16 = 8 images with CFG, 256 tokens, bf16. Cases:
diffusers eager; diffusers ``torch.compile`` + a CUDA graph (the best plain-PyTorch recipe); the fast
implementation under several switch combinations. For every case: a correctness check against
diffusers float32 (TF32 off) on the same inputs BEFORE timing (a failing case is not timed), compile /
capture time, peak VRAM above the resident weights, and the forward time (median; the timer is named).
``--sampling`` adds 50-step DDIM sampling with CFG + VAE decode: DiTPipeline vs the fast model in the
baseline's loop, with the fastest switch set this run timed (``--sampling-config auto``), in side-by-side
pairs of synchronised runs (wall clock); the speedup is the median of the pairs' ratios, with their range.
Every timed case also gets its rate over the forward's matmul FLOPs (issue 18: 3.79 TFLOP for XL/2 at
batch 16) and that rate's fraction of the device profile's measured bf16 GEMM peak. ``--profile`` adds one
traced run of each timed case, after its timing (the project's phase profile: GEMM, attention,
norm/elementwise, copies, idle; top kernels; a Perfetto trace under ``<out>/profiles/``). Writes JSON with
provenance to ``--out``; the tables are printed last. One failing case never loses the others.

    python benchmarks/dit_bench.py --out benchmarks/results [--sampling] [--profile] [--configs "a;b"]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

# importing harness puts the repository on sys.path
from harness import ROOT, gemm_peak_tflops, phase_profile, phase_table  # noqa: E402

DEFAULT_CONFIGS = (
    "default",
    "cuda_graphs=1",
    "cuda_graphs=1,fused_qkv=0",
    "cuda_graphs=1,gelu_epilogue=1",
    "cuda_graphs=1,gelu_epilogue=1,sdpa=cudnn",
    "cuda_graphs=1,gelu_epilogue=1,adaln=kernels",
    "cuda_graphs=1,gelu_epilogue=1,adaln=kernels,sdpa=cudnn",
    "cuda_graphs=1,gelu_epilogue=1,adaln=kernels,sdpa=cudnn,block_seam=1",
    "cuda_graphs=1,gelu_epilogue=1,adaln=kernels,sdpa=cudnn,block_seam=1,gemm=quack",
    "cuda_graphs=1,gelu_epilogue=1,adaln=kernels,sdpa=cudnn,block_seam=1,gemm=quack_fc1",
    "compile=blocks,cuda_graphs=1",
    "compile=blocks,cuda_graphs=1,gelu_epilogue=1",
    "compile=blocks,cuda_graphs=1,gelu_epilogue=1,sdpa=cudnn",
)
#: the sampling fallback when no forward was timed in the run: a fast set that needs no optional package
FASTEST = "cuda_graphs=1,gelu_epilogue=1,adaln=kernels,sdpa=cudnn"
#: rel-L2 bound against diffusers float32: the fast bf16 model must be as close as diffusers bf16 is
CHECK_FACTOR, CHECK_FLOOR = 2.0, 2e-3


def provenance() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"torch": torch.__version__, "cuda_runtime": torch.version.cuda,
                            "cudnn": torch.backends.cudnn.version(), "python": sys.version.split()[0],
                            "commit": os.environ.get("DITGATE_COMMIT")}
    for name in ("triton", "diffusers"):
        try:
            info[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001
            info[name] = None
    try:
        from harness import environment_record, real_device

        device = real_device()
        info["device"] = device.to_dict()
        info["environment"] = environment_record(device)
    except Exception as exc:  # noqa: BLE001 - provenance from torch alone then
        props = torch.cuda.get_device_properties(0)
        info["device"] = {"name": props.name, "arch": f"sm_{props.major}{props.minor}",
                          "sm_count": props.multi_processor_count, "memory": props.total_memory,
                          "note": f"pytest_ditgate.device unavailable: {exc}"}
    return info


def time_gpu(fn: Callable[[], Any], label: str, reps: int, mechanism: str) -> dict[str, Any]:
    """Median ms of ``fn`` via pytest_ditgate.measure if importable, else a local CUDA-events timer."""
    try:
        from pytest_ditgate import measure

        m = measure(fn, mechanism=mechanism, warmup=3, reps=reps, label=label)
        data = m.to_dict()
        return {"median_ms": m.median_ms, "mean_ms": m.mean_ms, "min_ms": m.min_ms, "cv": m.cv, "n": m.n,
                "mechanism": m.mechanism, "timer": "pytest_ditgate.measure",
                "raw": {k: v for k, v in data.items() if k not in ("samples_ms",)}}
    except Exception as exc:  # noqa: BLE001 - fall back, and say why
        reason = f"{type(exc).__name__}: {exc}"
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return {"median_ms": statistics.median(samples), "mean_ms": statistics.fmean(samples), "min_ms": min(samples),
            "n": len(samples), "mechanism": "events", "timer": f"local CUDA events per call ({reason})"}


def forward_flops(shapes: dict[str, Any]) -> float:
    """Matmul FLOPs of one forward: per block and image 24*T*D^2 (QKV, projection, the 4x MLP) + 4*T^2*D
    (attention scores and values); the patch embedding, adaLN and the final layer are left out (< 1 %)."""
    tokens, hidden, layers, batch = shapes["tokens"], shapes["hidden"], shapes["layers"], shapes["x"][0]
    return float(batch * layers * (24 * tokens * hidden ** 2 + 4 * tokens ** 2 * hidden))


def add_rates(results: list[dict[str, Any]], flops: float, peak: float | None) -> None:
    """``forward_tflops`` (matmul FLOPs over the median) and its fraction of ``peak`` on each timed case."""
    for r in results:
        ms = (r.get("timing") or {}).get("median_ms")
        if ms:
            r["forward_tflops"] = flops / (ms * 1e-3) / 1e12
            r["peak_fraction"] = r["forward_tflops"] / peak if peak else None


def rel_l2(a: Any, b: Any) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _peak_above(before: int) -> int:
    import torch

    return int(torch.cuda.max_memory_allocated() - before)


def _free() -> None:
    import torch

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        from dit_impl.baseline import load_model

        self.args = args
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        self.model = load_model("dit-xl-2-256", seed=args.seed, dtype="bfloat16", device="cuda")
        self.transformer = self.model.transformer
        n = args.images
        generator = torch.Generator().manual_seed(args.seed + 1)
        half = torch.randn(n, 4, 32, 32, generator=generator)
        self.x = torch.cat([half, half]).cuda().bfloat16()
        self.t = torch.full((2 * n,), 500, dtype=torch.long, device="cuda")
        labels = torch.randint(0, 1000, (n,), generator=generator)
        self.y = torch.cat([labels, torch.full((n,), 1000)]).cuda()
        self.shapes = {"x": list(self.x.shape), "timestep": list(self.t.shape), "class_labels": list(self.y.shape),
                       "tokens": 256, "hidden": 1152, "layers": 28}
        ref = type(self.transformer)(**self.transformer.config).to("cuda").eval().requires_grad_(False)
        ref.load_state_dict({k: v.float() for k, v in self.transformer.state_dict().items()})
        with torch.inference_mode():
            self.expected = ref(self.x.float(), timestep=self.t, class_labels=self.y).sample
            self.diffusers_bf16_error = rel_l2(self.transformer(self.x, timestep=self.t, class_labels=self.y).sample,
                                               self.expected)
        del ref
        _free()
        self.bound = max(CHECK_FACTOR * self.diffusers_bf16_error, CHECK_FLOOR)
        self.results: list[dict[str, Any]] = []

    def record(self, name: str, fn: Callable[[], dict[str, Any]]) -> None:
        import torch

        print(f"[dit_bench] {name} ...", flush=True)
        start = time.perf_counter()
        try:
            entry = {"name": name, **fn()}
        except Exception as exc:  # noqa: BLE001 - one failing case must not lose the others
            entry = {"name": name, "status": "error", "error": f"{type(exc).__name__}: {exc}",
                     "traceback": _scrub(traceback.format_exc(limit=6))}
        entry["case_seconds"] = round(time.perf_counter() - start, 2)
        self.results.append(entry)
        print(f"[dit_bench]   -> {entry.get('status')} {entry.get('timing', {}).get('median_ms')} "
              f"{entry.get('error', '')}", flush=True)
        _free()
        torch.cuda.reset_peak_memory_stats()

    def _check_and_time(self, forward: Callable[[], Any], timed: Callable[[], Any], label: str,
                        mechanism: str, setup_seconds: float, before: int, extra: dict[str, Any],
                        eager: Callable[[], Any] | None = None) -> dict[str, Any]:
        import torch

        with torch.inference_mode():
            out = forward()
            error = rel_l2(out, self.expected)
        peak = _peak_above(before)
        entry = {"rel_l2_vs_fp32": error, "bound": self.bound, "setup_seconds": round(setup_seconds, 2),
                 "peak_bytes_above_weights": peak, **extra}
        if not error < self.bound:
            return {**entry, "status": "wrong", "timing": None}
        with torch.inference_mode():
            timing = time_gpu(timed, label, self.args.reps, mechanism)
            if self.args.profile:  # after the timing: the timed samples never include the traced run
                entry["profile"] = self.profile(label, timed, timing["median_ms"], eager)
        return {**entry, "status": "ok", "timing": timing}

    def profile(self, label: str, timed: Callable[[], Any], timed_ms: float,
                eager: Callable[[], Any] | None) -> dict[str, Any]:
        """The phase profile of one traced run of ``timed``; a graph replay's kernels (no launching op) take
        their FLOPs and bytes from ``eager``, the same forward without the graph, traced once more."""
        return phase_profile(timed, label, Path(self.args.out), "dit_bench", timed_ms, eager)

    def diffusers_eager(self) -> dict[str, Any]:
        import torch

        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()

        def forward():
            return self.transformer(self.x, timestep=self.t, class_labels=self.y).sample

        return self._check_and_time(forward, forward, "diffusers-eager", "events", 0.0, before,
                                    {"mechanism_note": "CUDA events per eager call (launch overhead included)"})

    def diffusers_compile_graph(self) -> dict[str, Any]:
        import torch

        compiled = torch.compile(self.transformer, mode=self.args.compile_mode, dynamic=False)
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        with torch.inference_mode():
            for _ in range(2):
                compiled(self.x, timestep=self.t, class_labels=self.y)
            torch.cuda.synchronize()
            compile_seconds = time.perf_counter() - start
            graph = torch.cuda.CUDAGraph()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                compiled(self.x, timestep=self.t, class_labels=self.y)
            torch.cuda.current_stream().wait_stream(stream)
            with torch.cuda.graph(graph):
                out = compiled(self.x, timestep=self.t, class_labels=self.y).sample
        setup = time.perf_counter() - start

        def forward():
            graph.replay()
            return out.clone()

        return self._check_and_time(forward, graph.replay, "diffusers-compile+graph", "events", setup, before,
                                    {"compile_seconds": round(compile_seconds, 2),
                                     "mechanism_note": "CUDA events around one CUDA graph replay"},
                                    eager=lambda: compiled(self.x, timestep=self.t, class_labels=self.y))

    def fast(self, switches: str) -> dict[str, Any]:
        import torch

        from dit_impl.fast import FastOptions, fast_transformer

        options = FastOptions.parse(switches, FastOptions(dtype="bfloat16"))
        model = fast_transformer(self.transformer, options)
        base = getattr(model, "model", model)
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        with torch.inference_mode():
            model(self.x, timestep=self.t, class_labels=self.y)  # compile / capture happens here
        torch.cuda.synchronize()
        setup = time.perf_counter() - start
        weights = sum(t.numel() * t.element_size() for t in base.state_dict().values())

        def forward():
            return model(self.x, timestep=self.t, class_labels=self.y).sample

        if options.cuda_graphs:
            timed, mechanism, note = model.replay, "events", "CUDA events around one CUDA graph replay"
        else:
            timed, mechanism, note = forward, "events", "CUDA events per eager call (launch overhead included)"
        eager = (lambda: base(self.x, timestep=self.t, class_labels=self.y)) if options.cuda_graphs else None
        entry = self._check_and_time(forward, timed, f"fast[{options.label()}]", mechanism, setup, before,
                                     {"mechanism_note": note, "weights_bytes": weights}, eager)
        entry["report"] = model.report()
        entry["fell_back"] = fell_back(entry["report"])
        try:
            from torch._dynamo.utils import counters

            entry["dynamo_graph_breaks_so_far"] = {str(k): v for k, v in counters["graph_break"].items()}
        except Exception:  # noqa: BLE001
            pass
        entry["compile_seconds"] = round(setup, 2) if options.compile != "off" else 0.0
        entry["switches"] = switches
        return entry

    def sampling(self, switches: str) -> dict[str, Any]:
        """50-step CFG sampling + VAE decode: diffusers DiTPipeline vs the fast model in the baseline loop."""
        import torch
        from diffusers import DiTPipeline

        from dit_impl.baseline import make_scheduler
        from dit_impl.fast import FastOptions, fast_model
        from dit_impl.fast import sample as fast_sample

        labels = [int(v) for v in self.y[: self.args.images].tolist()]
        steps = self.args.steps
        pipe = DiTPipeline(transformer=self.transformer, vae=self.model.vae, scheduler=make_scheduler("ddim"))
        pipe.set_progress_bar_config(disable=True)

        def run_pipe():
            return pipe(class_labels=labels, num_inference_steps=steps, guidance_scale=4.0,
                        generator=torch.Generator("cpu").manual_seed(0), output_type="np").images

        fast = fast_model(self.model, FastOptions.parse(switches, FastOptions(dtype="bfloat16")))

        def run_fast():
            return fast_sample(fast, labels, seed=0, steps=steps, guidance_scale=4.0, scheduler="ddim").images.cpu()

        out: dict[str, Any] = {"steps": steps, "images": len(labels), "fast_switches": switches,
                               "mechanism": "wall clock around synchronised full runs, pipeline and fast side by "
                                            "side in pairs (order alternating); the ratio of each pair"}
        runs = {"diffusers_pipeline": run_pipe, "fast": run_fast}
        for name, fn in runs.items():  # the first call of each compiles, captures and allocates: not timed
            torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            out[name] = {"first_call_seconds": round(time.perf_counter() - start, 2),
                         "peak_bytes": int(torch.cuda.max_memory_allocated())}
        samples, speedup = paired_speedups(runs, self.args.sampling_reps, torch.cuda.synchronize)
        for name, taken in samples.items():
            out[name].update(samples_ms=taken, median_ms=statistics.median(taken))
        out.update(speedup)
        out["status"] = "ok"
        out["note"] = ("peak_bytes include every model resident in this process (baseline + fast weights); "
                       "a standalone fast sampler holds only its own weights")
        return out


def paired_speedups(runs: dict[str, Callable[[], Any]], pairs: int,
                    synchronize: Callable[[], None]) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Time ``runs["diffusers_pipeline"]`` and ``runs["fast"]`` side by side, ``pairs`` times, the order
    alternating so a drift of the host or the clocks falls on both: each run's samples (ms), and the speedup
    as the median of the pairs' ratios with their range (a launch-bound pipeline's time moves with the host)."""
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for index in range(pairs):
        order = ("diffusers_pipeline", "fast") if index % 2 == 0 else ("fast", "diffusers_pipeline")
        for name in order:
            start = time.perf_counter()
            runs[name]()
            synchronize()
            samples[name].append((time.perf_counter() - start) * 1e3)
    ratios = [pipe / fast for pipe, fast in zip(samples["diffusers_pipeline"], samples["fast"])]
    return samples, {"pair_speedups": ratios, "speedup": statistics.median(ratios),
                     "speedup_range": [min(ratios), max(ratios)], "pairs": pairs}


def fastest_forward(results: list[dict[str, Any]], fallback: str | None) -> str | None:
    """The switches of the fastest fast forward timed in this run (sampling then uses what was measured
    fastest, not a fixed guess); ``fallback`` when none was timed."""
    timed = [r for r in results if r.get("switches") is not None and r.get("status") == "ok"]
    return min(timed, key=lambda r: r["timing"]["median_ms"])["switches"] if timed else fallback


def _scrub(text: str) -> str:
    """Tracebacks without machine paths: repository-relative, site-packages-relative."""
    import re

    text = text.replace(str(ROOT) + "/", "")
    return re.sub(r'"[^"]*/site-packages/', '"site-packages/', text)


def _public_argv(argv: list[str]) -> list[str]:
    """The command line without the output folder (a path of the machine that ran it)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            out.append("<out>")
            skip = False
        elif arg == "--out":
            out.append(arg)
            skip = True
        else:
            out.append("--out=<out>" if arg.startswith("--out=") else arg)
    return out


def table(results: list[dict[str, Any]], eager_ms: float | None) -> str:
    lines = [f"{'case':58s} {'status':7s} {'median ms':>10s} {'vs eager':>8s} {'rel-L2':>9s} {'setup s':>8s} "
             f"{'peak MB':>8s} {'TFLOP/s':>8s} {'of peak':>7s}"]
    for r in results:
        if "steps" in r:
            continue
        timing = r.get("timing") or {}
        ms = timing.get("median_ms")
        speed = f"{eager_ms / ms:7.2f}x" if ms and eager_ms else ""
        err = r.get("rel_l2_vs_fp32")
        lines.append(f"{r['name'][:58]:58s} {r.get('status', '?'):7s} {ms if ms is None else round(ms, 3)!s:>10s} "
                     f"{speed:>8s} {'' if err is None else f'{err:.2e}':>9s} {r.get('setup_seconds', '')!s:>8s} "
                     f"{(r.get('peak_bytes_above_weights') or 0) / 2**20:8.0f} {_rates(r)}")
    lines += [f"  {r['name']}: {why}" for r in results for why in r.get("fell_back") or []]
    for r in results:
        if "steps" in r and r.get("status") == "ok":
            low, high = r["speedup_range"]
            lines.append(f"sampling {r['steps']} steps x {r['images']} images + VAE: diffusers pipeline "
                         f"{r['diffusers_pipeline']['median_ms']:.1f} ms, fast[{r['fast_switches']}] "
                         f"{r['fast']['median_ms']:.1f} ms -> {r['speedup']:.2f}x, the median of "
                         f"{r['pairs']} side-by-side pairs ({low:.2f}-{high:.2f}x); peak "
                         f"{r['fast']['peak_bytes'] / 2**30:.1f} GiB (all resident models)")
        elif "steps" in r:
            lines.append(f"sampling: {r.get('status')} {r.get('error', '')}")
    return "\n".join(lines)


def fell_back(report: dict[str, Any]) -> list[str]:
    """The switches a fast case asked for and did not get (the model reports each fall-back and its reason):
    a case labelled ``gemm=quack`` timed with cuBLAS must say so beside its time."""
    options = report.get("options") or {}
    out = []
    gemm = report.get("gemm") or {}
    if options.get("gemm") not in (None, gemm.get("impl")):
        out.append(f"gemm={options['gemm']} ran {gemm.get('impl')}: {gemm.get('reason')}")
    adaln = report.get("adaln") or {}
    if options.get("adaln") == "kernels" and adaln.get("impl") != "kernels":
        out.append(f"adaln=kernels ran {adaln.get('impl')}: {adaln.get('reason')}")
    if (report.get("sdpa") or {}).get("fallback"):
        out.append(f"sdpa={options.get('sdpa')} fell back on some shapes: {report['sdpa'].get('shapes')}")
    return out


def _rates(result: dict[str, Any]) -> str:
    """The TFLOP/s and peak-fraction columns of one case ("" where unknown)."""
    tflops, fraction = result.get("forward_tflops"), result.get("peak_fraction")
    return f"{'' if tflops is None else f'{tflops:.0f}':>8s} {'' if fraction is None else f'{fraction:.0%}':>7s}"


def profile_table(results: list[dict[str, Any]]) -> str:
    """The phase profiles of the timed cases, as ``pytest --ditgate --ditgate-profile`` prints them."""
    # named by the profile's label alone: the case name repeats it
    return phase_table([(r["profile"].get("label") or r["name"], r["profile"]) for r in results if r.get("profile")])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--configs", default=";".join(DEFAULT_CONFIGS), help="';'-separated FastOptions strings")
    parser.add_argument("--images", type=int, default=8, help="images per batch (CFG doubles the batch)")
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compile-mode", default="default", help="torch.compile mode of the diffusers recipe")
    parser.add_argument("--no-diffusers-compile", action="store_true", help="skip the diffusers compile recipe")
    parser.add_argument("--sampling", action="store_true", help="also time 50-step sampling + VAE decode")
    parser.add_argument("--sampling-config", default="auto",
                        help="FastOptions of the sampled model; auto: the fastest forward timed in this run")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--sampling-reps", type=int, default=7, help="side-by-side pairs of sampling runs")
    parser.add_argument("--profile", action="store_true", help="a phase profile of each timed case (one traced run)")
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("dit_bench: no CUDA device; this benchmark runs on a GPU only", file=sys.stderr)
        return 2
    started = time.time()
    bench = Bench(args)
    bench.record("diffusers eager", bench.diffusers_eager)
    if not args.no_diffusers_compile:
        bench.record(f"diffusers compile({args.compile_mode})+graph", bench.diffusers_compile_graph)
    for switches in filter(None, (s.strip() for s in args.configs.split(";"))):
        bench.record(f"fast[{switches}]", lambda s=switches: bench.fast(s))
    if args.sampling:
        switches = args.sampling_config if args.sampling_config != "auto" else fastest_forward(bench.results, None)
        origin = ("--sampling-config" if args.sampling_config != "auto" else
                  "the fastest forward timed in this run" if switches else
                  "FASTEST: no forward passed its check and was timed in this run")
        switches = switches or FASTEST
        bench.record("sampling", lambda: {**bench.sampling(switches), "fast_switches_from": origin})
    eager = next((r.get("timing") or {} for r in bench.results if r["name"] == "diffusers eager"), {}).get("median_ms")
    flops = forward_flops(bench.shapes)
    peak, peak_note = gemm_peak_tflops()
    add_rates(bench.results, flops, peak)
    data = {"benchmark": "dit_bench", "model": f"DiT-XL/2 (diffusers layout, random weights seed {args.seed})",
            "forward_flops": flops, "gemm_peak_tflops": peak, "gemm_peak_source": peak_note, "dtype": "bfloat16",
            "shapes": bench.shapes, "provenance": provenance(),
            "reference": "diffusers DiTTransformer2DModel float32, TF32 off, same inputs",
            "diffusers_bf16_rel_l2": bench.diffusers_bf16_error, "check_bound": bench.bound,
            "results": bench.results, "wall_seconds": round(time.time() - started, 1), "argv": _public_argv(sys.argv[1:])}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    arch = data["provenance"].get("device", {}).get("arch", "gpu")
    path = out / f"dit_bench_{arch}.json"
    path.write_text(json.dumps(data, indent=1, default=str))
    print(f"wrote {path}")
    if args.profile:
        print(profile_table(bench.results))
    print(f"forward: {flops / 1e12:.2f} TFLOP of matmuls; GEMM peak "
          + (f"{peak:.0f} TFLOP/s ({peak_note})" if peak else f"unknown ({peak_note})"))
    print(table(bench.results, eager))
    return 0


if __name__ == "__main__":
    sys.exit(main())
