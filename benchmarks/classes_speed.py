#!/usr/bin/env python3
"""Benchmark: the best honest candidate of each experiment class side by side, in ONE run, against diffusers
``torch.compile`` + a CUDA graph (DiT-XL/2, random weights, 8 images with CFG, bf16).

* forward time (CUDA events around one graph replay) for the exact best (``dit_bench.FASTEST``), the numerical
  ones on top of it (fp16; float32 with TF32) and the quantization ones (fp8 GEMMs with per-token x per-channel
  scales and with per-tensor scales, int8 weight-only), each checked against diffusers float32 before it is timed
  (bound: numerical twice diffusers' own bf16 error, quantization ``--quant-bound``: a structure check; quality
  is the lane's to judge);
* sampling time (wall clock around synchronised whole runs, side by side in pairs, order alternating) of the
  approximate best: the exact best with ``SamplerOptions(step_fraction=--fraction)`` (the fewest steps the
  calibration accepts, docs/quality_calibration.md) against the baseline's loop around diffusers compile + graph
  at the case's steps, and the exact best at full steps for scale.

    python benchmarks/classes_speed.py --out benchmarks/results [--fraction 0.2] [--steps 50]

Writes ``classes_speed_<arch>.json`` (provenance, every case's rel-L2, timer and times) and prints the table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

from dit_bench import FASTEST, Bench, provenance, rel_l2  # importing dit_bench puts the repository on sys.path

NUMERICAL = (f"{FASTEST},dtype=float16", f"{FASTEST},dtype=float32,tf32=1")
QUANTIZATION = (f"{FASTEST},quant=fp8", f"{FASTEST},quant=fp8_tensor", f"{FASTEST},quant=int8_weight")


class ClassesBench(Bench):
    def fast_within(self, switches: str, bound: float) -> dict[str, Any]:
        """``Bench.fast`` with another check bound (the class's), restored after."""
        saved, self.bound = self.bound, bound
        try:
            return self.fast(switches)
        finally:
            self.bound = saved

    def sampling_cases(self, fraction: float, steps: int, pairs: int) -> dict[str, Any]:
        """The approximate best's sampling against the baseline loop around diffusers compile + graph."""
        import torch

        from dit_impl.baseline import sample as baseline_sample
        from dit_impl.baseline.weights import DitModel
        from dit_impl.fast import FastOptions, fast_model
        from dit_impl.fast.graphs import GraphedDiT
        from dit_impl.fast.sampler import SamplerOptions, sample

        labels = [int(v) for v in self.y[: self.args.images].tolist()]
        compiled = torch.compile(self.transformer, mode=self.args.compile_mode, dynamic=False)
        reference = DitModel(self.model.config, GraphedDiT(compiled), self.model.vae, source=self.model.source,
                             implementation="diffusers compile+graph")
        best = fast_model(self.model, FastOptions.parse(FASTEST, FastOptions(dtype="bfloat16")))
        approximate = SamplerOptions(step_fraction=fraction)
        case = dict(class_labels=labels, seed=0, steps=steps, guidance_scale=4.0, scheduler="ddim")
        runs: dict[str, Callable[[], Any]] = {
            "diffusers compile+graph": lambda: baseline_sample(reference, **case).images,
            "exact best": lambda: sample(best, **case).images,
            f"approximate best ({approximate.label()})": lambda: sample(best, **case, options=approximate).images,
        }
        out: dict[str, Any] = {"steps": steps, "images": len(labels), "sampler": approximate.label(),
                               "taken_steps": approximate.steps_for(steps), "pairs": pairs,
                               "mechanism": "wall clock around synchronised whole runs (VAE decode included), "
                                            "side by side, order rotating"}
        with torch.inference_mode():
            images = {name: run() for name, run in runs.items()}  # compile, capture, allocate: not timed
            torch.cuda.synchronize()
            samples: dict[str, list[float]] = {name: [] for name in runs}
            names = list(runs)
            for index in range(pairs):
                for name in names[index % len(names):] + names[:index % len(names)]:
                    start = time.perf_counter()
                    runs[name]()
                    torch.cuda.synchronize()
                    samples[name].append((time.perf_counter() - start) * 1e3)
        reference_ms = statistics.median(samples["diffusers compile+graph"])
        out["cases"] = {name: {"median_ms": statistics.median(taken), "samples_ms": taken,
                               "ratio_to_diffusers": statistics.median(taken) / reference_ms,
                               "images_rel_l2_vs_diffusers": rel_l2(images[name].float(),
                                                                    images["diffusers compile+graph"].float())}
                        for name, taken in samples.items()}
        return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--images", type=int, default=8, help="images per batch (CFG doubles the batch)")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compile-mode", default="default")
    parser.add_argument("--fraction", type=float, default=0.2, help="the approximate best's step fraction")
    parser.add_argument("--steps", type=int, default=50, help="the sampled case's steps")
    parser.add_argument("--sampling-reps", type=int, default=5, help="rounds of the three sampling runs")
    parser.add_argument("--quant-bound", type=float, default=0.15, help="rel-L2 a quantized forward may show")
    args = parser.parse_args()
    args.profile = False

    import torch

    if not torch.cuda.is_available():
        print("classes_speed: no CUDA device; this benchmark runs on a GPU only", file=sys.stderr)
        return 2
    started = time.time()
    bench = ClassesBench(args)
    bench.record(f"diffusers compile({args.compile_mode})+graph", bench.diffusers_compile_graph)
    bench.record(f"exact: fast[{FASTEST}]", lambda: bench.fast(FASTEST))
    for switches in NUMERICAL:
        bench.record(f"numerical: fast[{switches}]", lambda s=switches: bench.fast(s))
    fp8 = torch.cuda.get_device_capability(0) >= (8, 9)
    for switches in QUANTIZATION:
        if "fp8" in switches and not fp8:
            continue
        bench.record(f"quantization: fast[{switches}]", lambda s=switches: bench.fast_within(s, args.quant_bound))
    bench.record("approximate: sampling", lambda: {"status": "ok", **bench.sampling_cases(
        args.fraction, args.steps, args.sampling_reps)})
    reference = next((r.get("timing") or {} for r in bench.results if r["name"].startswith("diffusers")), {})
    data = {"benchmark": "classes_speed", "model": f"DiT-XL/2 (diffusers layout, random weights seed {args.seed})",
            "shapes": bench.shapes, "provenance": provenance(), "check_bound": bench.bound,
            "quant_bound": args.quant_bound, "results": bench.results, "wall_seconds": round(time.time() - started, 1),
            "command": "python benchmarks/classes_speed.py " + " ".join(sys.argv[1:])}
    from harness import write_table

    arch = data["provenance"].get("device", {}).get("arch", "gpu")
    path = write_table(Path(args.out) / f"classes_speed_{arch}.json", data, table(bench.results, reference.get("median_ms")))
    print(f"wrote {path}")
    return 0


def table(results: list[dict[str, Any]], reference_ms: float | None) -> list[str]:
    lines = [f"{'case':<72} {'status':<7} {'median ms':>10} {'x diffusers':>12} {'rel-L2 fp32':>12}"]
    for result in results:
        if "cases" in result:
            for name, case in result["cases"].items():
                lines.append(f"{'sampling: ' + name:<72} {'ok':<7} {case['median_ms']:>10.2f} "
                             f"{case['ratio_to_diffusers']:>12.3f} {case['images_rel_l2_vs_diffusers']:>12.3g}")
            continue
        ms = (result.get("timing") or {}).get("median_ms")
        ratio = f"{ms / reference_ms:.3f}" if ms and reference_ms else "-"
        error = result.get("rel_l2_vs_fp32")
        lines.append(f"{result['name']:<72} {result.get('status', '?'):<7} {ms if ms is None else round(ms, 3)!s:>10} "
                     f"{ratio:>12} {'-' if error is None else format(error, '.3g'):>12}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
