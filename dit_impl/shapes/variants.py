"""Changes to a sampling model that the calibration and the negative controls judge (one definition each).

``erf_gelu`` and ``dropped_shift`` are harmful changes; ``erf_gelu`` is (the MLP's tanh GELU swapped for the erf GELU), ``int8_weight_only`` a
quantization (block Linear weights rounded to int8 per output channel, computed in float), and ``tf32``
switches TensorFloat-32 in matmuls and convolutions (off: a float32 reference is true float32).
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Iterator


@contextlib.contextmanager
def tf32(enabled: bool) -> Iterator[None]:
    import torch

    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def modulate_without_shift(x: Any, shift: Any, scale: Any, eps: float) -> Any:
    """adaLN modulate without its shift term, ``norm(x) * (1 + scale)``: a plausible 'fusion' slip (harmful)."""
    import torch.nn.functional as F

    return F.layer_norm(x, x.shape[-1:], eps=eps) * (1 + scale[:, None])


@contextlib.contextmanager
def dropped_shift() -> Iterator[None]:
    """The fast DiT's PyTorch adaLN ops (they look the op up at call time) without the shift, inside."""
    from dit_impl.fast import adaln

    saved = adaln.norm_modulate
    adaln.norm_modulate = modulate_without_shift
    try:
        yield
    finally:
        adaln.norm_modulate = saved


def _with_transformer_copy(model: Any) -> Any:
    out = copy.copy(model)
    out.transformer = copy.deepcopy(model.transformer)
    return out


def erf_gelu(model: Any) -> Any:
    """A copy of a baseline ``DitModel`` whose MLPs use the erf GELU instead of the tanh one."""
    out = _with_transformer_copy(model)
    for block in out.transformer.transformer_blocks:
        block.ff.net[0].approximate = "none"
    return out


def int8_weight_only(model: Any) -> Any:
    """A copy whose transformer-block Linear weights are rounded to int8 per output channel (symmetric),
    then computed in the model's dtype: weight-only quantization's error, without a quantized kernel."""
    import torch

    out = _with_transformer_copy(model)
    with torch.no_grad():
        for module in out.transformer.transformer_blocks.modules():
            if isinstance(module, torch.nn.Linear):
                w = module.weight
                scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127
                w.copy_((w / scale).round().clamp(-127, 127) * scale)
    return out
