"""Model construction: diffusers-format weights from a local folder, or deterministic random init.

A config that ships trained weights (``dit-s-shapes``) loads them by default, after checking every file
against the folder's sha256 manifest. A weights folder has ``transformer/`` and ``vae/`` subfolders as
``save_pretrained`` writes them (no ``vae/`` for a pixel-space config); it is
read with ``local_files_only=True`` and ``use_safetensors=True`` (never a download, never pickle) and
its shapes are checked against the named configuration. Without a folder, every parameter is drawn
from a generator seeded per parameter name, so the same seed gives the same model on any run.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dit_impl.baseline.configs import DitConfig, get_config

if TYPE_CHECKING:
    import torch
    from diffusers import AutoencoderKL, DiTTransformer2DModel

#: transformer config keys that must match the named configuration for loaded weights to be usable
_SHAPE_KEYS = ("num_attention_heads", "attention_head_dim", "in_channels", "out_channels", "num_layers",
               "sample_size", "patch_size", "num_embeds_ada_norm")
_VAE_KEYS = ("latent_channels", "block_out_channels")


class WeightsError(ValueError):
    """A weights folder is missing, incomplete, or does not match the named configuration."""


@dataclass
class DitModel:
    """A transformer and a VAE for one named configuration, with where their weights came from and which
    implementation runs them (a golden is made for weights, not for the code that ran them)."""

    config: DitConfig
    transformer: "DiTTransformer2DModel"
    vae: "AutoencoderKL | None"  # None in pixel space
    source: str  # "random(seed=N)", "local:<folder>" or "shipped:<config>@<sha256 prefix>"
    implementation: str = "baseline"  # or "fast(<switches>)"

    @property
    def dtype(self) -> "torch.dtype":
        return self.transformer.dtype

    @property
    def device(self) -> "torch.device":
        return self.transformer.device


def _param_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def init_random_(module: "torch.nn.Module", seed: int) -> None:
    """Fill every parameter from a generator seeded by ``(seed, parameter name)``, on the module's device.

    Matrices and convolution kernels get N(0, 1/fan_in); 1-D norm weights are 1; other vectors (biases,
    norm shifts) get N(0, 0.02). Per-name seeds make the result independent of construction order.
    """
    import torch

    with torch.no_grad():
        for name, param in module.named_parameters():
            generator = torch.Generator(device=param.device).manual_seed(_param_seed(seed, name))
            values = torch.empty(param.shape, dtype=torch.float32, device=param.device)
            if param.ndim >= 2:
                fan_in = math.prod(param.shape[1:])
                values.normal_(0.0, 1.0 / math.sqrt(fan_in), generator=generator)
            elif name.endswith("weight") and "norm" in name:
                values.fill_(1.0)
            else:
                values.normal_(0.0, 0.02, generator=generator)
            param.copy_(values.to(param.dtype))


def _random_model(config: DitConfig, seed: int, dtype: "torch.dtype", device: "torch.device") -> DitModel:
    import torch
    from diffusers import AutoencoderKL, DiTTransformer2DModel

    with torch.device(device):  # parameters are created (and drawn) on the target device: fast for XL
        transformer = DiTTransformer2DModel(**config.transformer)
        vae = AutoencoderKL(**config.vae) if config.vae is not None else None
    init_random_(transformer, seed)
    # nn.Module.to directly: diffusers' own .to() warns about casts that only matter for loaded checkpoints
    torch.nn.Module.to(transformer, dtype=dtype).eval()
    if vae is not None:
        init_random_(vae, seed + 1)
        torch.nn.Module.to(vae, dtype=dtype).eval()
    return DitModel(config, transformer, vae, source=f"random(seed={seed})")


def _check_folder(folder: Path, pixel_space: bool = False) -> None:
    if not folder.is_dir():
        raise WeightsError(f"weights folder {folder} does not exist")
    for sub in ("transformer",) if pixel_space else ("transformer", "vae"):
        part = folder / sub
        if not (part / "config.json").is_file():
            raise WeightsError(f"weights folder {folder}: {sub}/config.json is missing "
                               "(expected a diffusers-format folder with transformer/ and vae/)")
        if not any(part.glob("*.safetensors")):
            raise WeightsError(f"weights folder {folder}: no .safetensors file in {sub}/ "
                               "(only safetensors weights are loaded, never pickle)")


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, (list, tuple)) else value


def _check_shapes(config: DitConfig, transformer: Any, vae: Any, folder: Path) -> None:
    problems = []
    for key in _SHAPE_KEYS:
        want, got = config.transformer[key], transformer.config.get(key)
        if got != want:
            problems.append(f"transformer/{key}: config {config.name!r} needs {want!r}, folder has {got!r}")
    for key in _VAE_KEYS if vae is not None else ():
        want, got = _plain(config.vae[key]), _plain(vae.config.get(key))
        if got != want:
            problems.append(f"vae/{key}: config {config.name!r} needs {want!r}, folder has {got!r}")
    if problems:
        raise WeightsError(f"weights folder {folder} does not match config {config.name!r}:\n  " + "\n  ".join(problems))


def _local_model(config: DitConfig, folder: Path, dtype: "torch.dtype", device: "torch.device") -> DitModel:
    from diffusers import AutoencoderKL, DiTTransformer2DModel

    _check_folder(folder, pixel_space=config.vae is None)
    common = dict(local_files_only=True, use_safetensors=True, torch_dtype=dtype)
    transformer = DiTTransformer2DModel.from_pretrained(str(folder), subfolder="transformer", **common)
    vae = None if config.vae is None else AutoencoderKL.from_pretrained(str(folder), subfolder="vae", **common)
    _check_shapes(config, transformer, vae, folder)
    transformer.to(device).eval()
    if vae is not None:
        vae.to(device).eval()
    return DitModel(config, transformer, vae, source=f"local:{folder}")


def _shipped_model(config: DitConfig, dtype: "torch.dtype", device: "torch.device") -> DitModel:
    """The config's shipped trained weights, checked against their sha256 manifest first."""
    from dit_impl.shapes.bundle import BundleError, verify_bundle

    folder = config.shipped_weights
    try:
        manifest = verify_bundle(folder)
    except BundleError as exc:
        raise WeightsError(f"config {config.name!r}: {exc}") from None
    model = _local_model(config, folder, dtype, device)
    digest = manifest["files"].get("transformer/diffusion_pytorch_model.safetensors", {}).get("sha256", "")
    model.source = f"shipped:{config.name}@{digest[:12]}"
    return model


def load_model(config: str | DitConfig, *, weights: str | Path | None = None, seed: int = 0,
               dtype: "torch.dtype | str" = "float32", device: "torch.device | str" = "cpu") -> DitModel:
    """The model for ``config``: from the local diffusers folder ``weights``, else the config's shipped
    trained weights, else random from ``seed``."""
    import torch

    cfg = get_config(config) if isinstance(config, str) else config
    torch_dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    torch_device = torch.device(device)
    if weights is not None:
        return _local_model(cfg, Path(weights), torch_dtype, torch_device)
    if cfg.shipped_weights is not None:
        return _shipped_model(cfg, torch_dtype, torch_device)
    return _random_model(cfg, seed, torch_dtype, torch_device)


def save_model(model: DitModel, folder: str | Path) -> Path:
    """Write ``model`` as a diffusers-format folder (``transformer/``, ``vae/``, safetensors)."""
    target = Path(folder)
    model.transformer.save_pretrained(str(target / "transformer"), safe_serialization=True)
    if model.vae is not None:
        model.vae.save_pretrained(str(target / "vae"), safe_serialization=True)
    return target
