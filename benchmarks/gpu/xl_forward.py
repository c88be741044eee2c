"""The DiT-XL/2 forward case the GPU probes share: random weights, one CFG batch and its float32 answer.

``xl_case`` loads DiT-XL/2 in bf16 (random weights from the seed: nothing is downloaded), draws 8 images'
latents twice (conditional and unconditional halves, as the CFG sampler batches them) at timestep 500, and
runs diffusers' own transformer in float32 on the same weights for the reference output.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class XlCase:
    transformer: Any  # the bf16 diffusers DiTTransformer2DModel
    x: Any
    t: Any
    y: Any
    expected: Any  # float32 diffusers output on the same weights and inputs

    def run(self, model: Any) -> Any:
        """One forward of ``model`` (a fast or diffusers transformer) on the case's inputs."""
        import torch

        with torch.inference_mode():
            return model(self.x, timestep=self.t, class_labels=self.y).sample


def xl_case(images: int = 8, seed: int = 0) -> XlCase:
    """The bf16 XL model, a CFG batch of ``2 * images`` and the float32 reference (TF32 off)."""
    import torch

    from dit_impl.baseline import load_model

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    transformer = load_model("dit-xl-2-256", seed=seed, dtype="bfloat16", device="cuda").transformer
    generator = torch.Generator().manual_seed(seed + 1)
    half = torch.randn(images, 4, 32, 32, generator=generator)
    x = torch.cat([half, half]).cuda().bfloat16()
    t = torch.full((2 * images,), 500, dtype=torch.long, device="cuda")
    labels = torch.randint(0, 1000, (images,), generator=generator)
    y = torch.cat([labels, torch.full((images,), 1000)]).cuda()
    reference = type(transformer)(**transformer.config).to("cuda").eval().requires_grad_(False)
    reference.load_state_dict({k: v.float() for k, v in transformer.state_dict().items()})
    with torch.inference_mode():
        expected = reference(x.float(), timestep=t, class_labels=y).sample
    del reference
    torch.cuda.empty_cache()
    return XlCase(transformer, x, t, y, expected)


def case_arguments(description: str) -> argparse.ArgumentParser:
    """A probe's parser with the case's options: ``--out``, ``--images``, ``--rounds``, ``--seed``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    return parser
