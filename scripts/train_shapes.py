#!/usr/bin/env python3
"""Train the shapes classifier and the ``dit-s-shapes`` DiT, and write them with a sha256 manifest.

    python3 scripts/train_shapes.py --out fixtures/shapes --compile   # one H200: about 7.5 minutes

The defaults are the recipe of the shipped weights (their manifest's ``command``): batch 1024, peak rate 4e-4,
7 minutes, attention logits capped at 50 (without the cap, the logits ran away after about 4000 steps and the
loss spiked; benchmarks/results/shapes_training_uncapped_sm_90.log).

Writes ``<out>/transformer/`` (diffusers folder, safetensors, the EMA weights), ``<out>/classifier.safetensors``
(with the Frechet reference statistics) and ``<out>/manifest.json``: the command, the data seed, each
stage's steps, time and numbers, the device and versions, and every file's sha256 and size.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import time
from datetime import datetime, timezone
from functools import partial
from pathlib import Path

print = partial(print, flush=True)  # progress reaches a log as it happens
ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]


def _device_info(device: str) -> dict:
    import torch

    from pytest_ditgate.device_info import arch_label

    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        return {"name": props.name, "arch": arch_label((props.major, props.minor)), "cuda": torch.version.cuda}
    return {"name": platform.processor() or "cpu", "arch": "cpu"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="fixtures/shapes", help="output folder (default fixtures/shapes)")
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--classifier-steps", type=int, default=1500)
    parser.add_argument("--classifier-batch", type=int, default=256)
    parser.add_argument("--reference-images", type=int, default=10_000, help="real images of the Frechet reference")
    parser.add_argument("--held-out-images", type=int, default=5000)
    parser.add_argument("--dit-steps", type=int, default=20000, help="upper bound; --dit-minutes may cut it")
    parser.add_argument("--dit-batch", type=int, default=1024)
    parser.add_argument("--dit-minutes", type=float, default=7.0)
    parser.add_argument("--dit-lr", type=float, default=4e-4)
    parser.add_argument("--dit-logit-cap", type=float, default=50.0,
                        help="keep attention logits under this cap with a training penalty (0: none)")
    parser.add_argument("--compile", action="store_true", help="train the DiT through torch.compile")
    parser.add_argument("--preview", help="also write a grid of samples (4 per class, DDIM 50, guidance 4) as PPM")
    args = parser.parse_args(argv)

    import diffusers
    import torch
    from diffusers import DiTTransformer2DModel
    from safetensors.torch import save_file

    from dit_impl.baseline.configs import get_config
    from dit_impl.shapes.bundle import CLASSIFIER, MANIFEST, TRANSFORMER, describe_files
    from dit_impl.shapes.training import WATCH_STREAMS, train_classifier, train_dit

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    classifier, classifier_log = train_classifier(args.device, args.data_seed, steps=args.classifier_steps,
                                                  batch=args.classifier_batch,
                                                  reference_images=args.reference_images,
                                                  held_out=args.held_out_images, log=print)
    config = get_config("dit-s-shapes")
    torch.manual_seed(args.data_seed)
    transformer = DiTTransformer2DModel(**config.transformer)
    ema, dit_log = train_dit(transformer, args.device, args.data_seed, steps=args.dit_steps, batch=args.dit_batch,
                             max_seconds=args.dit_minutes * 60, lr=args.dit_lr, compile=args.compile,
                             logit_cap=args.dit_logit_cap or None, log=print)
    ema.to("cpu").save_pretrained(str(out / TRANSFORMER), safe_serialization=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in classifier.state_dict().items()}, str(out / CLASSIFIER))
    command = "python3 scripts/train_shapes.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    manifest = {
        "what": "dit-s-shapes: a class-conditional pixel-space DiT and a classifier, trained on the procedural "
                "shapes family (dit_impl/shapes/family.py)",
        "command": command.strip(),
        "data_seed": args.data_seed,
        "data_streams": {"classifier": args.data_seed, "dit": args.data_seed + 1,
                         "held_out_accuracy": args.data_seed + 2, "frechet_reference": args.data_seed + 3,
                         **{f"watched_{name}": args.data_seed + offset for name, offset in WATCH_STREAMS.items()}},
        "classifier": {"steps": classifier_log.steps, "seconds": round(classifier_log.seconds, 1),
                       **classifier_log.numbers},
        "dit": {"steps": dit_log.steps, "seconds": round(dit_log.seconds, 1), **dit_log.numbers},
        "total_seconds": round(time.perf_counter() - started, 1),
        "device": _device_info(args.device),
        "torch": torch.__version__, "diffusers": diffusers.__version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "files": describe_files(out),
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: manifest[k] for k in ("classifier", "dit", "total_seconds")}, indent=2))
    if args.preview:
        write_preview(out, classifier, args.device, Path(args.preview))
    return 0


def write_preview(folder: Path, classifier, device: str, target: Path) -> None:
    """A grid (one row per class) of samples at the baseline setting, and their per-class accuracy."""
    import torch

    from dit_impl.baseline import load_model, sample

    model = load_model("dit-s-shapes", weights=folder, device=device)
    labels = [label for label in range(10) for _ in range(8)]
    images = sample(model, labels, seed=0, steps=50, guidance_scale=4.0).images
    with torch.no_grad():
        right = (classifier(images).argmax(dim=1).cpu() == torch.tensor(labels)).view(10, 8).float().mean(dim=1)
    print("preview accuracy per class:", [round(float(v), 2) for v in right])
    grid = images.view(10, 8, 3, 32, 32).permute(0, 3, 1, 4, 2).reshape(320, 256, 3)
    pixels = (grid.clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy().tobytes()
    target.write_bytes(b"P6 256 320 255\n" + pixels)


if __name__ == "__main__":
    sys.exit(main())
