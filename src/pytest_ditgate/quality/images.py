"""Failure images: the worst images of a failed case side by side (baseline, candidate, error heat map).

PNGs under ``<dir>/<case>/<tensor>_img<i>.png`` (PIL, imported lazily), written atomically; the paths
go into the failure message so a reader can open exactly the images that failed.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

from pytest_ditgate.fsutil import atomic_write_bytes
from pytest_ditgate.quality.specs import HIGHER, METRICS

MAX_IMAGES = 3  # worst images written per failed tensor
MIN_PANEL = 128  # px: tiny test images are upscaled (nearest) so a reader can see them
HEADER = 14  # px of caption above the panels


def safe_name(text: str) -> str:
    """``text`` as one path component (pytest node ids have ``/``, ``::`` and ``[]``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "case"


def worst_indices(per_image: dict[str, Any], fallback: Any, count: int = MAX_IMAGES) -> list[int]:
    """Indices of the worst images by the first failed per-image metric (else by ``fallback`` errors)."""
    for metric, values in per_image.items():
        order = values.argsort(descending=METRICS[metric].direction != HIGHER)
        return [int(i) for i in order[:count]]
    return [int(i) for i in fallback.argsort(descending=True)[:count]]


def heat_colours(error: Any) -> Any:
    """A black-red-yellow-white heat map (uint8 HxWx3) of a non-negative HxW error, scaled to its max."""
    import torch

    peak = float(error.max())
    x = error / peak if peak > 0 else torch.zeros_like(error)
    rgb = torch.stack([(3 * x).clamp(0, 1), (3 * x - 1).clamp(0, 1), (3 * x - 2).clamp(0, 1)], dim=-1)
    return (rgb * 255).round().to(torch.uint8)


def _to_rgb(image: Any) -> Any:
    """A CxHxW ``[0, 1]`` image as uint8 HxWx3."""
    import torch

    if image.shape[0] == 1:
        image = image.expand(3, -1, -1)
    return (image.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0)


def side_by_side(baseline: Any, candidate: Any, caption: str) -> bytes:
    """PNG bytes: baseline | candidate | error heat map, with a one-line caption."""
    from PIL import Image, ImageDraw

    error = (candidate.float() - baseline.float()).abs().mean(dim=0)
    panels = [_to_rgb(baseline), _to_rgb(candidate), heat_colours(error)]
    h, w = panels[0].shape[:2]
    zoom = max(1, -(-MIN_PANEL // min(h, w)))
    gap = 4
    canvas = Image.new("RGB", (3 * w * zoom + 2 * gap, h * zoom + HEADER), (255, 255, 255))
    for i, panel in enumerate(panels):
        tile = Image.fromarray(panel.contiguous().cpu().numpy(), "RGB")
        if zoom > 1:
            tile = tile.resize((w * zoom, h * zoom), Image.NEAREST)
        canvas.paste(tile, (i * (w * zoom + gap), HEADER))
    ImageDraw.Draw(canvas).text((2, 1), caption, fill=(0, 0, 0))
    buffer = io.BytesIO()
    canvas.save(buffer, format="PNG")
    return buffer.getvalue()


def write_failure_images(root: Path, case: str, failed: dict[str, dict[str, Any]]) -> list[str]:
    """Write the worst images of each failed image tensor; return their paths."""
    from pytest_ditgate.quality.metrics import worst_tile_mae_per_image

    folder = root / safe_name(case)
    for stale in folder.glob("*.png"):  # stale images of another run of this case would mislead
        stale.unlink(missing_ok=True)
    paths: list[str] = []
    for key, info in failed.items():
        cand, base = info["candidate"].detach().cpu(), info["baseline"].detach().cpu()
        tiles = worst_tile_mae_per_image(cand, base, info["tile"])
        for index in worst_indices(info["per_image"], tiles):
            peak = float((cand[index] - base[index]).abs().max())
            if peak == 0.0:
                continue  # an identical image is not worth a file
            values = ", ".join(f"{m} {float(v[index]):.4g}" for m, v in info["per_image"].items())
            caption = f"{key}[{index}] baseline | candidate | error (max {peak:.3g}) {values}"
            path = folder / f"{safe_name(key)}_img{index}.png"
            atomic_write_bytes(path, side_by_side(base[index], cand[index], caption))
            paths.append(str(path))
    return paths
