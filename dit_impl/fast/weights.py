"""Loading diffusers ``DiTTransformer2DModel`` weights into ``FastDiT``: same state-dict layout, real checkpoints.

Per-block embedders are stacked (or kept once when all blocks hold identical copies, as converted
DiT-XL/2 checkpoints do), Q/K/V are concatenated when ``fused_qkv`` is on, and every key is accounted
for: a missing, unexpected or mis-shaped tensor raises ``FastWeightsError`` naming it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from dit_impl.fast.embeddings import patch_positions
from dit_impl.fast.options import FastOptions

if TYPE_CHECKING:
    import torch

    from dit_impl.fast.model import FastDiT

_EMB = "transformer_blocks.{i}.norm1.emb."
_EMB_KEYS = ("timestep_embedder.linear_1.weight", "timestep_embedder.linear_1.bias",
             "timestep_embedder.linear_2.weight", "timestep_embedder.linear_2.bias",
             "class_embedder.embedding_table.weight")
#: diffusers per-block key -> FastBlock parameter (Q/K/V handled apart)
_BLOCK_KEYS = {"attn1.to_out.0.weight": "out.weight", "attn1.to_out.0.bias": "out.bias",
               "ff.net.0.proj.weight": "fc1.weight", "ff.net.0.proj.bias": "fc1.bias",
               "ff.net.2.weight": "fc2.weight", "ff.net.2.bias": "fc2.bias"}
_TOP_KEYS = {"pos_embed.proj.weight": "patch.weight", "pos_embed.proj.bias": "patch.bias",
             "proj_out_1.weight": "proj_out_1.weight", "proj_out_1.bias": "proj_out_1.bias",
             "proj_out_2.weight": "proj_out_2.weight", "proj_out_2.bias": "proj_out_2.bias"}


class FastWeightsError(ValueError):
    """A state dict or weights folder does not fit the fast DiT (names the tensor or file)."""


def _shared_embedders(sd: Mapping[str, "torch.Tensor"], layers: int) -> bool:
    import torch

    return all(torch.equal(sd[_EMB.format(i=0) + key], sd[_EMB.format(i=i) + key])
               for i in range(1, layers) for key in _EMB_KEYS)


def _convert(sd: Mapping[str, "torch.Tensor"], layers: int, fused_qkv: bool, shared: bool) -> dict[str, "torch.Tensor"]:
    """diffusers key -> FastDiT key, consuming every input key (``FastWeightsError`` on missing ones)."""
    import torch

    used: set[str] = set()

    def take(key: str) -> "torch.Tensor":
        if key not in sd:
            raise FastWeightsError(f"state dict lacks {key!r} (not a diffusers DiTTransformer2DModel state dict?)")
        used.add(key)
        return sd[key]

    out = {dst: take(src) for src, dst in _TOP_KEYS.items()}
    embedder_ids = [0] if shared else list(range(layers))
    emb = {key: [take(_EMB.format(i=i) + key) for i in range(layers)] for key in _EMB_KEYS}
    for key, name in zip(_EMB_KEYS, ("cond.t_w1", "cond.t_b1", "cond.t_w2", "cond.t_b2", "cond.labels")):
        out[name] = torch.stack([emb[key][i] for i in embedder_ids])
    out["cond.ada_w"] = torch.stack([take(f"transformer_blocks.{i}.norm1.linear.weight") for i in range(layers)])
    out["cond.ada_b"] = torch.stack([take(f"transformer_blocks.{i}.norm1.linear.bias") for i in range(layers)])
    for i in range(layers):
        block = f"transformer_blocks.{i}."  # the same prefix in both layouts
        for key, name in _BLOCK_KEYS.items():
            out[block + name] = take(block + key)
        for part in ("weight", "bias"):
            q, k, v = (take(f"{block}attn1.to_{x}.{part}") for x in "qkv")
            if fused_qkv:
                out[f"{block}qkv.{part}"] = torch.cat([q, k, v], dim=0)
            else:
                out[f"{block}q.{part}"], out[f"{block}k.{part}"], out[f"{block}v.{part}"] = q, k, v
    unexpected = sorted(set(sd) - used)
    if unexpected:
        raise FastWeightsError(f"state dict has {len(unexpected)} key(s) the fast DiT does not use: "
                               f"{', '.join(unexpected[:5])}{' ...' if len(unexpected) > 5 else ''}")
    return out


def load_diffusers_state_dict(sd: Mapping[str, "torch.Tensor"], config: Any, options: FastOptions | None = None,
                              *, device: "torch.device | str | None" = None) -> "FastDiT":
    """A prepared ``FastDiT`` from a diffusers DiT state dict and its config (mapping or FrozenDict)."""
    import torch

    from dit_impl.fast.model import DitShape, FastDiT

    options = options or FastOptions()
    shape = DitShape.from_config(config)
    layers = shape.num_layers
    if _EMB.format(i=layers) + _EMB_KEYS[0] in sd:
        raise FastWeightsError(f"state dict has more than num_layers={layers} blocks")
    shared = layers > 1 and all(_EMB.format(i=i) + k in sd for i in range(layers) for k in _EMB_KEYS) \
        and _shared_embedders(sd, layers)
    converted = _convert(sd, layers, options.fused_qkv, shared)
    target = torch.device(device) if device is not None else next(iter(sd.values())).device
    with torch.device("meta"):
        model = FastDiT(shape, options, embedders=1 if shared else layers)
    expected = model.state_dict()
    for name, tensor in converted.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise FastWeightsError(f"tensor {name!r}: shape {tuple(tensor.shape)} does not fit the config "
                                   f"(expected {tuple(expected[name].shape)})")
    dtype = options.torch_dtype
    model.load_state_dict({k: v.to(device=target, dtype=dtype) for k, v in converted.items()}, assign=True)
    # the position table is a non-persistent buffer (not in any state dict): rebuild it off the meta device
    model.pos_embed = patch_positions(shape.hidden, shape.grid).to(target)
    return model.eval().requires_grad_(False).prepare()


def from_diffusers(model: Any, options: FastOptions | None = None, *,
                   device: "torch.device | str | None" = None) -> "FastDiT":
    """A ``FastDiT`` with the weights of a live diffusers ``DiTTransformer2DModel`` (on its device by default)."""
    return load_diffusers_state_dict(model.state_dict(), model.config, options, device=device or model.device)


def from_pretrained(folder: str | Path, options: FastOptions | None = None, *,
                    device: "torch.device | str" = "cpu") -> "FastDiT":
    """Load from a local diffusers folder (``config.json`` + ``*.safetensors``, or its ``transformer/`` subfolder)."""
    from safetensors.torch import load_file

    root = Path(folder)
    if (root / "transformer" / "config.json").is_file():
        root = root / "transformer"
    config_path = root / "config.json"
    if not config_path.is_file():
        raise FastWeightsError(f"{config_path} does not exist (expected a diffusers DiT transformer folder)")
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise FastWeightsError(f"no .safetensors file in {root} (only safetensors weights are loaded, never pickle)")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise FastWeightsError(f"{config_path} is not readable JSON: {exc}") from exc
    sd: dict[str, Any] = {}
    for file in files:
        sd.update(load_file(str(file), device=str(device)))
    return load_diffusers_state_dict(sd, config, options, device=device)
