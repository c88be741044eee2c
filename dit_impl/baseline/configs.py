"""Named DiT configurations: the transformer and VAE shapes of each workload, as plain data (no torch).

``tiny`` runs on two CPU cores in a fraction of a second per image; ``dit-xl-2-256`` is DiT-XL/2 at
256x256 (28 layers, hidden 1152, 16 heads, patch 2, 32x32x4 latent, learned sigma, SD-shaped VAE).
Both have random weights: they judge speed and structure. ``dit-s-shapes`` is a small pixel-space DiT
trained by the project on a procedural family of ten shapes (``dit_impl.shapes``): its samples mean
something, so it is the configuration whose cases judge perceptual quality.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent.parent

#: DiTPipeline's null class id for classifier-free guidance; the label table therefore has 1001 rows
NULL_CLASS = 1000
NUM_CLASSES = 1000


@dataclass(frozen=True)
class DitConfig:
    """One named workload shape: ``transformer`` and ``vae`` are diffusers constructor kwargs."""

    name: str
    transformer: dict[str, Any]
    vae: dict[str, Any] | None  # None: pixel space (the transformer denoises images in [-1, 1])
    description: str = ""
    weights_dir: str | None = None  # trained weights shipped with the project (relative to the repository root)

    @property
    def num_classes(self) -> int:
        """Class labels are 0..num_classes-1; ``num_classes`` is the CFG null class."""
        return int(self.transformer["num_embeds_ada_norm"])

    @property
    def null_class(self) -> int:
        return self.num_classes

    @property
    def shipped_weights(self) -> Path | None:
        """The folder of the trained weights this config ships with, or None (random weights)."""
        return REPO_ROOT / self.weights_dir if self.weights_dir else None

    @property
    def latent_size(self) -> int:
        return int(self.transformer["sample_size"])

    @property
    def latent_channels(self) -> int:
        return int(self.transformer["in_channels"])

    @property
    def learned_sigma(self) -> bool:
        return int(self.transformer["out_channels"]) == 2 * self.latent_channels

    @property
    def vae_scale(self) -> int:
        """Pixels per latent cell: 2 ** (number of VAE blocks - 1); 1 in pixel space."""
        if self.vae is None:
            return 1
        return 2 ** (len(self.vae["block_out_channels"]) - 1)

    @property
    def resolution(self) -> int:
        """Side of the decoded image in pixels."""
        return self.latent_size * self.vae_scale

    @property
    def hidden_size(self) -> int:
        return int(self.transformer["num_attention_heads"]) * int(self.transformer["attention_head_dim"])

    @property
    def num_layers(self) -> int:
        return int(self.transformer["num_layers"])


_TINY = DitConfig(
    name="tiny",
    description="2 layers, hidden 64 (4 heads x 16), patch 2, 8x8x4 latent, 2-block VAE -> 16x16 images",
    transformer=dict(
        num_attention_heads=4, attention_head_dim=16, in_channels=4, out_channels=8, num_layers=2,
        sample_size=8, patch_size=2, norm_num_groups=32, attention_bias=True, activation_fn="gelu-approximate",
        num_embeds_ada_norm=NUM_CLASSES, norm_type="ada_norm_zero", norm_elementwise_affine=False,
    ),
    vae=dict(
        in_channels=3, out_channels=3, latent_channels=4, layers_per_block=1, norm_num_groups=8,
        block_out_channels=(16, 32), down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, scaling_factor=0.18215, sample_size=16,
    ),
)

_XL_2_256 = DitConfig(
    name="dit-xl-2-256",
    description="DiT-XL/2 at 256x256: 28 layers, hidden 1152 (16 heads x 72), patch 2, 32x32x4 latent, "
                "learned sigma, SD-shaped AutoencoderKL (4 blocks, 128-512 channels)",
    transformer=dict(
        num_attention_heads=16, attention_head_dim=72, in_channels=4, out_channels=8, num_layers=28,
        sample_size=32, patch_size=2, norm_num_groups=32, attention_bias=True, activation_fn="gelu-approximate",
        num_embeds_ada_norm=NUM_CLASSES, norm_type="ada_norm_zero", norm_elementwise_affine=False,
    ),
    vae=dict(
        in_channels=3, out_channels=3, latent_channels=4, layers_per_block=2, norm_num_groups=32,
        block_out_channels=(128, 256, 512, 512), down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4, scaling_factor=0.18215, sample_size=256,
    ),
)

_S_SHAPES = DitConfig(
    name="dit-s-shapes",
    description="8 layers, hidden 128 (4 heads x 32), patch 2, pixel space 32x32x3, 10 classes; trained on the "
                "procedural shapes family (weights in fixtures/shapes/)",
    transformer=dict(
        num_attention_heads=4, attention_head_dim=32, in_channels=3, out_channels=3, num_layers=8,
        sample_size=32, patch_size=2, norm_num_groups=32, attention_bias=True, activation_fn="gelu-approximate",
        num_embeds_ada_norm=10, norm_type="ada_norm_zero", norm_elementwise_affine=False,
    ),
    vae=None,
    weights_dir="fixtures/shapes",
)

CONFIGS: dict[str, DitConfig] = {c.name: c for c in (_TINY, _XL_2_256, _S_SHAPES)}


def get_config(name: str) -> DitConfig:
    """The named configuration; an unknown name raises ``KeyError`` listing the known ones."""
    try:
        return CONFIGS[name]
    except KeyError:
        raise KeyError(f"unknown DiT config {name!r}; known: {', '.join(sorted(CONFIGS))}") from None
