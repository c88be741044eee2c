"""Benchmark: the cost of each quality metric, and of a full quality check, on the current device.

8 images 256x256 (and their 4x32x32 latents) per case, as the DiT-XL/2 suite judges them. LPIPS and
CLIP use randomly initialised networks saved to a temporary folder and loaded through the plugin's
real local-weights path (torchvision's AlexNet file under TORCH_HOME, an open_clip ViT-B-32 checkpoint
file): the cost is the same as with pretrained weights and nothing is downloaded.
Timer: CUDA events around each call after warm-up (median of N) on a GPU, perf_counter on the CPU.
H200 reference (DESIGN.md): LPIPS 3.9 ms, SSIM 1.2 ms, CLIP ViT-B/32 image encode 4.2 ms.

    python benchmarks/quality_metrics.py --out benchmarks/results/

Writes ``quality_metrics_<arch>.json`` with full provenance and prints a table last. A metric that
fails is recorded with its error; the others still run.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from harness import ROOT, guarded  # noqa: E402 - puts the repository on sys.path


def timer(device: Any) -> tuple[str, Callable[[Callable[[], Any], int, int], Any]]:
    """``pytest_ditgate.measure`` per call: CUDA events on a GPU (metrics sync inside), the host clock on CPU."""
    from pytest_ditgate import measure

    mechanism = "events" if device.type == "cuda" else "wall"

    def run(fn: Callable[[], Any], warmup: int, reps: int) -> Any:
        return measure(fn, mechanism=mechanism, warmup=warmup, reps=reps)

    return f"pytest_ditgate.measure(mechanism={mechanism!r})", run


def time_case(fn: Callable[[], Any], run: Callable[[Callable[[], Any], int, int], Any], reps: int) -> dict[str, Any]:
    """The first call's wall time (it loads models and fills caches), then ``reps`` timed calls."""
    load_start = time.perf_counter()
    fn()
    first_ms = (time.perf_counter() - load_start) * 1e3
    m = run(fn, 3, reps)
    return {"median_ms": m.median_ms, "min_ms": m.min_ms, "max_ms": m.max_ms, "stdev_ms": m.stdev_ms, "cv": m.cv,
            "n": m.n, "mechanism": m.mechanism, "first_call_ms": first_ms, "samples_ms": list(m.samples_ms)}


def save_random_weights(folder: Path) -> dict[str, str]:
    """Random AlexNet trunk where torchvision looks, and a random ViT-B-32 open_clip checkpoint file."""
    import os

    import open_clip
    import torch
    import torchvision
    from safetensors.torch import save_file

    from pytest_ditgate.quality.perceptual import ALEXNET_FILE

    torch.manual_seed(0)
    hub = folder / "torch_home" / "hub" / "checkpoints"
    hub.mkdir(parents=True)
    features = torchvision.models.alexnet(weights=None).features
    torch.save({f"features.{k}": v for k, v in features.state_dict().items()}, hub / ALEXNET_FILE)
    os.environ["TORCH_HOME"] = str(folder / "torch_home")
    model = open_clip.create_model("ViT-B-32", pretrained=None, load_weights=False, pretrained_text=False)
    path = folder / "vit_b_32_random.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return {"clip": str(path), "clip_model": "ViT-B-32"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--size", type=int, default=256)
    args = parser.parse_args()

    import torch

    from pytest_ditgate.device import real_device
    from pytest_ditgate.environment import environment_record
    from pytest_ditgate.quality import metrics as M
    from pytest_ditgate.quality.contract import contract_from_dict
    from pytest_ditgate.quality.evaluate import evaluate_quality
    from pytest_ditgate.quality.perceptual import PerceptualModels, WeightsConfig

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    mechanism, run = timer(device)
    n, size = args.images, args.size
    g = torch.Generator(device="cpu").manual_seed(0)
    base = torch.nn.functional.avg_pool2d(torch.rand(n, 3, size, size, generator=g), 5, 1, 2).to(device)
    cand = (base + 0.01 * torch.randn(base.shape, generator=g).to(device)).clamp(0, 1)
    lat_b = torch.randn(n, 4, size // 8, size // 8, generator=g).to(device)
    lat_c = lat_b.bfloat16().float()
    prompts = ["a photo of a golden retriever"] * n
    tmp = tempfile.TemporaryDirectory()
    results: dict[str, Any] = {}
    try:
        weights = save_random_weights(Path(tmp.name))
    except Exception as exc:  # the weight-free metrics still run
        weights = {}
        results["_weights"] = {"error": f"{type(exc).__name__}: {exc}"}
    models = PerceptualModels(WeightsConfig(clip=weights.get("clip"), clip_model=weights.get("clip_model", "ViT-B-32")))

    cases: dict[str, Callable[[], Any]] = {
        "psnr": lambda: M.psnr_per_image(cand, base),
        "ssim": lambda: M.ssim_per_image(cand, base),
        "worst_tile_mae": lambda: M.worst_tile_mae_per_image(cand, base, 16),
        "lpips": lambda: models.lpips_per_image(cand, base),
        "clip_score (image encode, cached text)": lambda: models.clip(device).score(cand, prompts),
        "clip image encode only": lambda: models.clip(device).image_features(cand),
        "latent rel_l2+cosine+max_ulp": lambda: (M.rel_l2(lat_c, lat_b), M.cosine_similarity(lat_c, lat_b),
                                                 M.max_ulp(lat_c, lat_b)),
    }
    contract = contract_from_dict({"images": {"tile": 16}, "metrics": {
        "psnr": {"approximate": {"min": 20.0}}, "ssim": {"approximate": {"min": 0.5}},
        "worst_tile_mae": {"approximate": {"max": 0.5}}, "lpips": {"approximate": {"max": 10.0}},
        "clip_score": {"approximate": {"abs": 100.0}},
        "rel_l2": {"kinds": ["latent"], "approximate": {"max": 0.1}},
        "cosine": {"kinds": ["latent"], "approximate": {"min": 0.9}}}}, source="benchmark")
    cases["full quality check (all metrics, 1 case)"] = lambda: evaluate_quality(
        {"image": cand, "latent": lat_c}, {"image": base, "latent": lat_b}, contract=contract,
        experiment_class="approximate", case="bench", prompts=prompts[0], models=models)

    for name, fn in cases.items():
        guarded(results, name, lambda fn=fn: time_case(fn, run, args.reps))

    full = evaluate_quality({"image": cand, "latent": lat_c}, {"image": base, "latent": lat_b}, contract=contract,
                            experiment_class="approximate", case="bench", prompts=prompts[0], models=models)
    dev = real_device()
    record = {
        "benchmark": "quality_metrics",
        "mechanism": mechanism,
        "device": str(device), "arch": dev.arch, "device_name": dev.name,
        "workload": {"images": [n, 3, size, size], "image_dtype": "float32", "latents": [n, 4, size // 8, size // 8],
                     "latent_dtype": "bfloat16 vs float32", "tile": 16, "lpips": "AlexNet v0.1 (random weights)",
                     "clip": "open_clip ViT-B-32 (random weights, fp32)"},
        "full_check_metrics": full.metrics, "full_check_skipped": full.skipped,
        "results": results,
        "environment": environment_record(dev, cwd=ROOT),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"quality_metrics_{dev.arch}.json"
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")
    tmp.cleanup()

    print(f"\nquality metrics on {dev.describe()}, {n} images {size}x{size}, timer: {mechanism}")
    print(f"{'metric':<44} {'median ms':>10} {'min ms':>9} {'first call ms':>14}")
    for name, value in results.items():
        if "error" in value:
            print(f"{name:<44} ERROR {value['error'][:80]}")
        else:
            print(f"{name:<44} {value['median_ms']:>10.3f} {value['min_ms']:>9.3f} {value['first_call_ms']:>14.1f}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
