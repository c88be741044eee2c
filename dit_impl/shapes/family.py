"""A procedural image family: ten classes of shapes and textures, drawn from a seed on any device.

Each image is one class's figure in a random colour over a random background of enough contrast, at a
random position, size and (for textures) period and phase. Figures are signed-distance masks with a
one-pixel anti-aliased edge, so a model that learns them must get edges right, not only colours.
The class is never in the colours: only the geometry tells the classes apart.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

CLASSES = ("disc", "square", "triangle", "ring", "plus", "diamond", "h-stripes", "v-stripes", "checker", "x-cross")
NUM_CLASSES = len(CLASSES)
SIZE = 32
#: the smallest colour distance (RGB Euclidean, [0, 1]) between figure and background
MIN_CONTRAST = 0.45


def _params(n: int, generator: "torch.Generator", device: "torch.device") -> dict[str, "torch.Tensor"]:
    import torch

    def uniform(*shape: int, low: float = 0.0, high: float = 1.0) -> torch.Tensor:
        return low + (high - low) * torch.rand(*shape, generator=generator, device=device)

    return {"centre": uniform(n, 2, low=-0.25, high=0.25), "radius": uniform(n, low=0.38, high=0.62),
            "period": uniform(n, low=5.0, high=9.0), "phase": uniform(n, high=2 * math.pi),
            "fg": uniform(n, 3), "bg": uniform(n, 3), "width": uniform(n, low=0.26, high=0.36)}


def _box(dx: "torch.Tensor", dy: "torch.Tensor", hx: "torch.Tensor", hy: "torch.Tensor") -> "torch.Tensor":
    """Signed distance to an axis-aligned box of half-sizes ``hx``, ``hy`` (negative inside)."""
    import torch

    qx, qy = dx.abs() - hx, dy.abs() - hy
    outside = torch.sqrt(qx.clamp(min=0) ** 2 + qy.clamp(min=0) ** 2)
    return outside + torch.maximum(qx, qy).clamp(max=0)


def _figure_sdf(label: "torch.Tensor", dx: "torch.Tensor", dy: "torch.Tensor", r: "torch.Tensor",
                w: "torch.Tensor") -> "torch.Tensor":
    """Signed distance (in [-1, 1] image units) to each image's figure; textures are handled apart."""
    import torch

    dist = torch.sqrt(dx ** 2 + dy ** 2)
    u, v = (dx + dy) / math.sqrt(2), (dx - dy) / math.sqrt(2)
    # an upward triangle: the largest of three edge distances (normals at 90, 210 and 330 degrees)
    edges = [math.cos(a) * dx - math.sin(a) * dy for a in (math.pi / 2, 7 * math.pi / 6, 11 * math.pi / 6)]
    triangle = torch.maximum(torch.maximum(edges[0], edges[1]), edges[2]) - 0.5 * r
    arm, thick = r, w * r
    table = [
        dist - r,                                                               # disc
        _box(dx, dy, 0.8 * r, 0.8 * r),                                         # square
        triangle,                                                               # triangle
        (dist - 0.78 * r).abs() - 0.22 * r,                                     # ring
        torch.minimum(_box(dx, dy, arm, thick), _box(dx, dy, thick, arm)),     # plus
        (dx.abs() + dy.abs()) - 1.1 * r,                                        # diamond
    ]
    cross = torch.minimum(_box(u, v, arm, thick), _box(u, v, thick, arm))       # x-cross
    out = cross.clone()
    for index, sdf in enumerate(table):
        out = torch.where(label == index, sdf, out)
    return out


def render(labels: "torch.Tensor", generator: "torch.Generator", *, size: int = SIZE) -> "torch.Tensor":
    """Images ``(N, 3, size, size)`` in ``[0, 1]`` of the classes ``labels``, on the generator's device.

    The same labels, generator state and device give the same images; parameters are drawn in one
    order for every class, so image ``i`` does not depend on the other labels.
    """
    import torch

    device = generator.device
    labels = labels.to(device=device, dtype=torch.long).view(-1, 1, 1)
    n = labels.shape[0]
    if n and not bool(((labels >= 0) & (labels < NUM_CLASSES)).all()):
        raise ValueError(f"shape labels must be in 0..{NUM_CLASSES - 1}, got {labels.flatten().tolist()}")
    p = _params(n, generator, device)
    pixel = 2.0 / size
    axis = (torch.arange(size, device=device, dtype=torch.float32) + 0.5) * pixel - 1.0
    y, x = torch.meshgrid(axis, axis, indexing="ij")
    dx = x[None] - p["centre"][:, 0, None, None]
    dy = y[None] - p["centre"][:, 1, None, None]
    r, w = p["radius"][:, None, None], p["width"][:, None, None]
    figure = (0.5 - _figure_sdf(labels, dx, dy, r, w) / pixel).clamp(0, 1)
    # textures over the whole image: a wave's zero crossings with a one-pixel edge
    k = 2 * math.pi / (p["period"][:, None, None] * pixel)
    phase = p["phase"][:, None, None]
    waves = {6: torch.sin(k * y[None] + phase), 7: torch.sin(k * x[None] + phase),
             8: torch.sin(k * x[None] + phase) * torch.sin(k * y[None] + phase)}
    slope = p["period"][:, None, None] / (2 * math.pi)  # wave units per pixel at a crossing
    for index, wave in waves.items():
        figure = torch.where(labels == index, (0.5 + wave * slope).clamp(0, 1), figure)
    fg, bg = p["fg"], p["bg"]
    close = (fg - bg).norm(dim=1) < MIN_CONTRAST
    bg = torch.where(close[:, None], 1.0 - fg, bg)
    still = (fg - bg).norm(dim=1) < MIN_CONTRAST  # fg near grey: push the background to black or white
    bg = torch.where(still[:, None], (fg.mean(dim=1, keepdim=True) < 0.5).float().expand(-1, 3), bg)
    mask = figure[:, None]
    return fg[:, :, None, None] * mask + bg[:, :, None, None] * (1 - mask)


def balanced_labels(count: int, *, per_class: int | None = None) -> list[int]:
    """``count`` labels cycling through the classes (0, 1, ..., 9, 0, ...), or ``per_class`` of each."""
    if per_class is not None:
        return [label for label in range(NUM_CLASSES) for _ in range(per_class)]
    return [index % NUM_CLASSES for index in range(count)]


def real_images(count: int, seed: int, *, device: "torch.device | str" = "cpu") -> tuple["torch.Tensor", "torch.Tensor"]:
    """``count`` balanced real images of the family drawn from ``seed`` (labels, images)."""
    import torch

    generator = torch.Generator(device=device).manual_seed(seed)
    labels = torch.tensor(balanced_labels(count), device=device)
    return labels, render(labels, generator)
