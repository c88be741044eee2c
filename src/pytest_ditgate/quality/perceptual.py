"""LPIPS and CLIP score from pretrained weights on local paths only: nothing here ever downloads.

Both networks are built with random initialisation (``lpips.LPIPS(pretrained=False, pnet_rand=True)``,
``open_clip.create_model(..., load_weights=False)``) and then get their weights from local files
through ``torch.load(weights_only=True)`` or safetensors. Where the weights are absent,
:class:`MissingWeights` carries a reason that says exactly how to provide them. Loaded models are
cached per :class:`PerceptualModels` (one per pytest session).
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from pytest_ditgate.errors import DitgateUsageError

if TYPE_CHECKING:
    import torch

#: torchvision's file name for ImageNet AlexNet weights (``AlexNet_Weights.IMAGENET1K_V1``)
ALEXNET_FILE = "alexnet-owt-7be5be79.pth"
#: the LPIPS v0.1 linear-layer weights for the AlexNet trunk (shipped inside the ``lpips`` package)
LPIPS_LINEAR_FILE = "alex.pth"
DEFAULT_CLIP_MODEL = "ViT-B-32"
CLIP_CONFIG_FILE = "open_clip_config.json"
CLIP_CHECKPOINT_NAMES = ("open_clip_model.safetensors", "open_clip_pytorch_model.safetensors",
                         "open_clip_pytorch_model.bin", "model.safetensors", "pytorch_model.bin")

HOW_LPIPS = ("provide local LPIPS weights: put torchvision's {alex} where torchvision looks ({hub}, set TORCH_HOME "
             "to move it) or point --ditgate-lpips-weights (ini ditgate_lpips_weights) at a folder holding it "
             "(directly or under hub/checkpoints/), optionally with the LPIPS linear layers {lin} "
             "(default: the copy shipped with the lpips package); no download is attempted")
HOW_CLIP = ("provide a local CLIP checkpoint: point --ditgate-clip-weights (ini ditgate_clip_weights) at an "
            "open_clip checkpoint file (.safetensors/.pt/.bin) and name its architecture with --ditgate-clip-model "
            "(default {model}), or at a folder holding {config} and {ckpt}; no download is attempted")


class MissingWeights(Exception):
    """Pretrained weights a metric needs are not available locally; ``str()`` says how to provide them."""


class BadWeights(MissingWeights):
    """Weight files exist but do not fit the network (wrong file, truncated, other architecture)."""


@dataclass(frozen=True)
class WeightsConfig:
    """Where the user keeps perceptual-metric weights (options, ini or ``[tool.ditgate]``)."""

    lpips: str | None = None
    clip: str | None = None
    clip_model: str = DEFAULT_CLIP_MODEL
    classifier: str | None = None  # "package.module:callable" (quality.learned)
    root: str | None = None  # the project root, where the classifier's package may live

    @classmethod
    def from_settings(cls, root: Path | str, settings: Mapping[str, Any]) -> "WeightsConfig":
        """The weights a project names, keyed as in ``[tool.ditgate]`` (``lpips_weights``, ``clip_weights``,
        ``clip_model``, ``classifier``; relative paths are the root's): one reading for the pytest session
        and the experiment judge, so both judge with the same models."""
        from pytest_ditgate.project_config import project_path

        def text(key: str) -> str | None:
            value = settings.get(key)
            return value if isinstance(value, str) and value else None

        def rooted(key: str) -> str | None:
            path = text(key)
            return None if path is None else str(project_path(root, path))

        return cls(lpips=rooted("lpips_weights"), clip=rooted("clip_weights"),
                   clip_model=text("clip_model") or DEFAULT_CLIP_MODEL, classifier=text("classifier"), root=str(root))


def torch_hub_checkpoints() -> Path:
    """Where torchvision looks for (and would download) checkpoints: ``$TORCH_HOME/hub/checkpoints``."""
    import torch

    return Path(torch.hub.get_dir()) / "checkpoints"


def lpips_files(setting: str | None, package_dir: Path | None = None) -> tuple[Path, Path]:
    """The AlexNet backbone and LPIPS linear-layer files to use, or :class:`MissingWeights` saying how.
    ``package_dir``: the lpips package's folder, where the doctor located it without importing it."""
    if package_dir is None:
        import lpips

        package_dir = Path(lpips.__file__).parent
    bundled = package_dir / "weights" / "v0.1" / LPIPS_LINEAR_FILE
    hub = torch_hub_checkpoints()
    how = HOW_LPIPS.format(alex=ALEXNET_FILE, hub=hub / ALEXNET_FILE, lin=LPIPS_LINEAR_FILE)
    if setting:
        folder = Path(setting).expanduser()
        if not folder.is_dir():
            raise MissingWeights(f"LPIPS weights folder {folder} (--ditgate-lpips-weights) does not exist; {how}")
        candidates = [folder / ALEXNET_FILE, folder / "hub" / "checkpoints" / ALEXNET_FILE,
                      folder / "checkpoints" / ALEXNET_FILE]
        linear = folder / LPIPS_LINEAR_FILE if (folder / LPIPS_LINEAR_FILE).is_file() else bundled
    else:
        candidates = [hub / ALEXNET_FILE]
        linear = bundled
    backbone = next((path for path in candidates if path.is_file()), None)
    if backbone is None:
        raise MissingWeights(f"LPIPS weights not found (looked for {', '.join(str(p) for p in candidates)}); {how}")
    if not linear.is_file():
        raise MissingWeights(f"LPIPS linear layers {linear} not found; {how}")
    return backbone, linear


def _load_tensors(path: Path) -> dict[str, Any]:
    import torch

    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated or foreign file: say which one
        raise BadWeights(f"cannot read weights file {path}: {type(exc).__name__}: {exc}") from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise BadWeights(f"weights file {path} holds a {type(state).__name__}, not a state dict")
    return state


def build_lpips(setting: str | None) -> "torch.nn.Module":
    """An LPIPS (AlexNet, v0.1) network whose trunk and linear layers come from local files."""
    import lpips

    backbone_path, linear_path = lpips_files(setting)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = lpips.LPIPS(pretrained=False, net="alex", version="0.1", pnet_rand=True, verbose=False)
    backbone = _load_tensors(backbone_path)
    trunk = {}
    for name in model.net.state_dict():  # "slice2.3.weight" <- torchvision "features.3.weight"
        _, index, param = name.split(".", 2)
        source = f"features.{index}.{param}"
        if source not in backbone:
            raise BadWeights(f"{backbone_path} is not a torchvision AlexNet state dict (no {source!r})")
        trunk[name] = backbone[source]
    linear = _load_tensors(linear_path)
    lin_names = [name for name in model.state_dict() if re.match(r"lin\d+\.", name)]  # not the "lins." aliases
    missing = [name for name in lin_names if name not in linear]
    if missing:
        raise BadWeights(f"{linear_path} lacks LPIPS linear layers {missing[:3]}")
    try:
        model.net.load_state_dict(trunk, strict=True)
        model.load_state_dict({name: linear[name] for name in lin_names}, strict=False)
    except RuntimeError as exc:
        raise BadWeights(f"LPIPS weights from {backbone_path} / {linear_path} do not fit: {exc}") from None
    return model.eval().requires_grad_(False)


def clip_source(config: WeightsConfig) -> tuple[str, Path]:
    """The open_clip model spec and checkpoint file to load, or :class:`MissingWeights` saying how."""
    how = HOW_CLIP.format(model=DEFAULT_CLIP_MODEL, config=CLIP_CONFIG_FILE, ckpt=CLIP_CHECKPOINT_NAMES[0])
    if not config.clip:
        raise MissingWeights(f"CLIP weights are not configured; {how}")
    path = Path(config.clip).expanduser()
    if path.is_dir():
        if not (path / CLIP_CONFIG_FILE).is_file():
            raise MissingWeights(f"CLIP weights folder {path} has no {CLIP_CONFIG_FILE}; {how}")
        found = [path / name for name in CLIP_CHECKPOINT_NAMES if (path / name).is_file()]
        if not found:
            raise MissingWeights(f"CLIP weights folder {path} has no checkpoint ({', '.join(CLIP_CHECKPOINT_NAMES)}); {how}")
        return f"local-dir:{path}", found[0]
    if not path.is_file():
        raise MissingWeights(f"CLIP checkpoint {path} (--ditgate-clip-weights) does not exist; {how}")
    return config.clip_model, path


@dataclass
class ClipScorer:
    """An open_clip model, its tokenizer and preprocessing, scoring images against prompts."""

    model: Any
    tokenizer: Callable[[list[str]], Any]
    size: tuple[int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    _text_cache: dict[Any, Any] = field(default_factory=dict, repr=False)

    def image_features(self, images: "torch.Tensor") -> "torch.Tensor":
        """Unit-norm embeddings of ``[0, 1]`` images (resized shortest side, centre-cropped, normalised)."""
        import torch
        import torch.nn.functional as F

        images = images.float()
        h, w = images.shape[-2:]
        th, tw = self.size
        scale = max(th / h, tw / w)
        resized = F.interpolate(images, size=(max(th, round(h * scale)), max(tw, round(w * scale))),
                                mode="bicubic", antialias=True, align_corners=False)
        top, left = (resized.shape[-2] - th) // 2, (resized.shape[-1] - tw) // 2
        crop = resized[..., top:top + th, left:left + tw].clamp(0, 1)
        mean = torch.tensor(self.mean, device=crop.device).view(1, -1, 1, 1)
        std = torch.tensor(self.std, device=crop.device).view(1, -1, 1, 1)
        if crop.shape[1] == 1:
            crop = crop.expand(-1, 3, -1, -1)
        with torch.no_grad():
            feats = self.model.encode_image((crop - mean) / std)
        return F.normalize(feats.float(), dim=-1)

    def text_features(self, prompts: list[str], device: "torch.device") -> "torch.Tensor":
        """Unit-norm prompt embeddings, cached: baseline and candidate of every case share their prompts."""
        import torch
        import torch.nn.functional as F

        key = (tuple(prompts), str(device))
        if key not in self._text_cache:
            with torch.no_grad():
                feats = self.model.encode_text(self.tokenizer(prompts).to(device))
            self._text_cache[key] = F.normalize(feats.float(), dim=-1)
        return self._text_cache[key]

    def score(self, images: "torch.Tensor", prompts: Sequence[str]) -> "torch.Tensor":
        """CLIP score per image, ``max(100 * cos(image, prompt), 0)`` (torchmetrics' convention)."""
        img = self.image_features(images)
        txt = self.text_features(list(prompts), img.device)
        return (100.0 * (img * txt).sum(dim=-1)).clamp(min=0.0)


def build_clip(config: WeightsConfig, device: "torch.device | str" = "cpu") -> ClipScorer:
    """An open_clip model built offline and loaded from the configured local checkpoint."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a tokenizer or tower that wants the hub fails instead
    import open_clip

    spec, checkpoint = clip_source(config)
    quiet = logging.getLogger()
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # open_clip logs "initialized randomly" before we load the weights
    try:
        try:
            model = open_clip.create_model(spec, pretrained=None, load_weights=False, pretrained_text=False,
                                           pretrained_image=False, device="cpu")
        except RuntimeError as exc:
            raise DitgateUsageError(f"open_clip has no model {spec!r} (--ditgate-clip-model): {exc}") from None
        try:
            open_clip.load_checkpoint(model, str(checkpoint), strict=True, weights_only=True)
        except Exception as exc:
            raise BadWeights(f"CLIP checkpoint {checkpoint} does not fit model {spec}: "
                             f"{type(exc).__name__}: {str(exc)[:300]}") from None
        tokenizer = open_clip.get_tokenizer(spec)
    finally:
        quiet.setLevel(level)
    visual = model.visual
    size = visual.image_size if isinstance(visual.image_size, tuple) else (visual.image_size,) * 2
    pre = getattr(visual, "preprocess_cfg", None) or {}
    mean = tuple(pre.get("mean", open_clip.OPENAI_DATASET_MEAN))
    std = tuple(pre.get("std", open_clip.OPENAI_DATASET_STD))
    return ClipScorer(model.eval().requires_grad_(False).to(device), tokenizer, tuple(size), mean, std)


@dataclass
class PerceptualModels:
    """Loads LPIPS and CLIP on first use and keeps them (per device) for the rest of the session."""

    config: WeightsConfig = field(default_factory=WeightsConfig)
    _cache: dict[tuple[str, str], Any] = field(default_factory=dict, repr=False)

    def _get(self, what: str, device: Any, build: Callable[[], Any]) -> Any:
        key = (what, str(device))
        if key not in self._cache:
            try:
                self._cache[key] = build()
            except MissingWeights as exc:
                self._cache[key] = exc  # remember the reason: do not probe the disk for every case
        value = self._cache[key]
        if isinstance(value, MissingWeights):
            raise value
        return value

    def lpips(self, device: Any = "cpu") -> "torch.nn.Module":
        return self._get("lpips", device, lambda: build_lpips(self.config.lpips).to(device))

    def clip(self, device: Any = "cpu") -> ClipScorer:
        return self._get("clip", device, lambda: build_clip(self.config, device))

    def classifier(self, device: Any = "cpu") -> Any:
        """The project's classifier for the learned metrics (``quality.learned``), built once per device."""
        from pytest_ditgate.quality.learned import HOW_CLASSIFIER, build_classifier

        def build() -> Any:
            if not self.config.classifier:
                raise MissingWeights(f"no classifier is configured; {HOW_CLASSIFIER}")
            return build_classifier(self.config.classifier, device, self.config.root)

        return self._get("classifier", device, build)

    def lpips_per_image(self, candidate: "torch.Tensor", baseline: "torch.Tensor") -> "torch.Tensor":
        """LPIPS of each ``[0, 1]`` image pair (the network sees ``[-1, 1]``)."""
        import torch

        model = self.lpips(candidate.device)
        c, b = candidate.float(), baseline.float()
        if c.shape[1] == 1:
            c, b = c.expand(-1, 3, -1, -1), b.expand(-1, 3, -1, -1)
        with torch.no_grad():
            return model(c * 2 - 1, b * 2 - 1).flatten()
