"""Freeze DiT-XL/2 goldens for this GPU's arch and show bf16 passes ``numerical`` but fails ``exact``.

For every ``dit-xl-2-256`` case of ``fixtures/dit_corpus.toml`` (random weights, seed 0):

1. in this process: the float32 reference (TF32 off) and a bf16 run, both timed with CUDA sync; the
   bf16 outputs judged against the float32 ones under the quality contract's ``numerical`` class
   (must pass) and ``exact`` class (must fail), each evaluation timed;
2. ``--freeze``: ``pytest --ditgate --ditgate-freeze tests/gates/dit -k xl`` writes the missing goldens
   for this arch (``golden/<sm_XY>/xl-*.safetensors`` + manifest; relocks the fixed paths when they are
   configured), then ``pytest --ditgate tests/gates/dit`` runs the full DiT quality suite (tiny CPU
   cases + XL bf16 numerical + XL exact-must-fail) and its wall time is recorded.

Usage: ``python benchmarks/dit_golden_h200.py --out benchmarks/results [--freeze] [--golden-dir golden]``.
Writes ``dit_golden_<arch>.json`` with full provenance and prints a short table last. One failing case
or step is recorded and the others still run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness import ROOT, guarded, log  # noqa: E402 - puts the repository on sys.path

SEED = 0
ACT_IMAGES, ACT_TOKENS = 1, 64  # same selection as tests/gates/dit (golden size budget)


def timed_sample(model: Any, case: Any) -> tuple[dict, float]:
    import torch

    from dit_impl.baseline import sample

    torch.cuda.synchronize()
    start = time.perf_counter()
    result = sample(model, **case.sample_kwargs())
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return result.tensors(activation_images=ACT_IMAGES, activation_tokens=ACT_TOKENS), seconds


def judge(candidate: dict, baseline: dict, case: str, experiment_class: str) -> dict:
    from pytest_ditgate.quality import evaluate_quality

    start = time.perf_counter()
    result = evaluate_quality(candidate, baseline, contract=ROOT / "fixtures" / "quality_contract.toml",
                              experiment_class=experiment_class, case=case)
    seconds = time.perf_counter() - start
    return {"passed": result.passed, "failures": result.failures, "metrics": result.metrics,
            "skipped": result.skipped, "dtype": result.dtype, "seconds": seconds}


def run_case(case: Any, models: dict) -> dict:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    reference, t_fp32 = timed_sample(models["float32"], case)
    candidate, t_bf16 = timed_sample(models["bfloat16"], case)
    reference = {k: v.cpu() for k, v in reference.items()}
    candidate = {k: v.cpu() for k, v in candidate.items()}
    golden_bytes = sum(t.numel() * t.element_size() for t in reference.values())
    out = {"case": case.name, "steps": case.steps, "batch": len(case.class_labels), "scheduler": case.scheduler,
           "guidance_scale": case.guidance_scale, "sample_seconds": {"float32": t_fp32, "bfloat16": t_bf16},
           "golden_tensor_bytes": golden_bytes,
           "tensors": {k: [list(v.shape), str(v.dtype)] for k, v in reference.items()}}
    out["numerical"] = judge(candidate, reference, case.name, "numerical")
    out["exact"] = judge(candidate, reference, case.name, "exact")
    out["exact_fp32_rerun"] = judge(timed_sample(models["float32"], case)[0], reference, case.name, "exact")
    return out


def run_pytest(args: list[str], timeout: int) -> dict:
    command = [sys.executable, "-m", "pytest", "-p", "no:randomly", "-q", *args]
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    return {"command": " ".join(command[1:]), "returncode": proc.returncode,
            "seconds": time.perf_counter() - start, "tail": proc.stdout[-3000:] + proc.stderr[-1000:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--freeze", action="store_true", help="freeze missing goldens via pytest, then time the suite")
    parser.add_argument("--golden-dir", default=None, help="golden store folder (default: the repo's golden/)")
    args = parser.parse_args()

    import torch

    from dit_impl.baseline import load_model
    from dit_impl.corpus import load_corpus, select
    from harness import environment_record, real_device

    device = real_device()
    results: dict[str, Any] = {"benchmark": "dit_golden", "environment": environment_record(device, cwd=ROOT),
                               "timer": "time.perf_counter around torch.cuda.synchronize (whole sampling loop)",
                               "weights": f"random(seed={SEED})", "reference": "float32, TF32 off",
                               "candidate": "bfloat16", "cases": {}}
    if not torch.cuda.is_available():
        log("no CUDA device: nothing to do")
        results["error"] = "no CUDA device"
    else:
        cases = select(load_corpus(), config="dit-xl-2-256")
        start = time.perf_counter()
        models = {dtype: load_model("dit-xl-2-256", seed=SEED, dtype=dtype, device="cuda")
                  for dtype in ("float32", "bfloat16")}
        results["model_init_seconds"] = time.perf_counter() - start
        for case in cases:
            log(f"case {case.name} ...")
            guarded(results["cases"], case.name, lambda case=case: run_case(case, models))
        del models
        torch.cuda.empty_cache()
        if args.freeze:
            extra = ["--ditgate-golden-dir", args.golden_dir] if args.golden_dir else []
            guarded(results, "freeze", lambda: run_pytest(["--ditgate", "--ditgate-freeze", "tests/gates/dit",
                                                           "-k", "xl", *extra], 400))
            guarded(results, "quality_suite", lambda: run_pytest(["--ditgate", "tests/gates/dit", "-rA", *extra], 400))

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"dit_golden_{device.arch}.json"
    text = json.dumps(results, indent=2, default=str).replace(str(ROOT), "<repo>").replace(str(Path.home()), "~")
    path.write_text(text + "\n")  # no machine paths in results that may be committed

    print(f"\nDiT-XL/2 goldens on {device.describe()} (random weights seed {SEED}); JSON: {path}")
    print(f"{'case':<12} {'fp32 s':>7} {'bf16 s':>7} {'golden MB':>9} {'numerical':>10} {'exact(bf16)':>12} "
          f"{'exact(fp32 rerun)':>18} {'quality s':>9}")
    for name, case in results["cases"].items():
        if "error" in case:
            print(f"{name:<12} ERROR {case['error']}")
            continue
        quality_s = case["numerical"]["seconds"] + case["exact"]["seconds"]
        print(f"{name:<12} {case['sample_seconds']['float32']:7.2f} {case['sample_seconds']['bfloat16']:7.2f} "
              f"{case['golden_tensor_bytes'] / 2**20:9.2f} {'PASS' if case['numerical']['passed'] else 'FAIL':>10} "
              f"{'PASS' if case['exact']['passed'] else 'FAIL':>12} "
              f"{'PASS' if case['exact_fp32_rerun']['passed'] else 'FAIL':>18} {quality_s:9.2f}")
    for key in ("freeze", "quality_suite"):
        if key in results:
            step = results[key]
            status = step.get("error") or f"exit {step['returncode']} in {step['seconds']:.1f} s"
            print(f"{key:<14} {status}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
