"""Options of the quality gate (light: imported at every pytest start to declare them)."""

from __future__ import annotations

from pytest_ditgate.options import OptionSpec
from pytest_ditgate.quality.specs import DEFAULT_CLASS, EXPERIMENT_CLASSES

CONTRACT = OptionSpec("--ditgate-contract", "quality contract TOML (default: [tool.ditgate] quality_contract, "
                                            "else fixtures/quality_contract.toml under the rootdir)")
EXPERIMENT_CLASS = OptionSpec("--ditgate-class", "experiment class of the candidate, which picks the quality "
                                                 "contract's limits (default numerical)",
                              choices=EXPERIMENT_CLASSES, default=DEFAULT_CLASS)
LPIPS_WEIGHTS = OptionSpec("--ditgate-lpips-weights", "folder with torchvision's alexnet-owt-7be5be79.pth (and "
                                                      "optionally LPIPS alex.pth); default: torchvision's "
                                                      "$TORCH_HOME/hub/checkpoints. Never downloaded")
CLIP_WEIGHTS = OptionSpec("--ditgate-clip-weights", "open_clip checkpoint file, or a folder with "
                                                    "open_clip_config.json + open_clip_model.safetensors; "
                                                    "never downloaded")
CLIP_MODEL = OptionSpec("--ditgate-clip-model", "open_clip architecture of --ditgate-clip-weights "
                                                "(default ViT-B-32)", default="ViT-B-32")
CLASSIFIER = OptionSpec("--ditgate-classifier", "the project's classifier factory 'package.module:callable' for the "
                                                "learned metrics class_accuracy and frechet_distance (called with a "
                                                "device; see pytest_ditgate.quality.learned)")
OPTIONS = (CONTRACT, EXPERIMENT_CLASS, LPIPS_WEIGHTS, CLIP_WEIGHTS, CLIP_MODEL, CLASSIFIER)
