"""The DiT benchmark corpus (``fixtures/dit_corpus.toml``): loaded into frozen cases, validated strictly.

Every problem names the file, the case and the field, and unknown fields are errors (a typo must not
silently fall back to a default). Torch-free.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dit_impl.baseline.configs import CONFIGS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: the corpus shipped with this repository, relative to the repository root
DEFAULT_CORPUS = Path(__file__).resolve().parent.parent / "fixtures" / "dit_corpus.toml"
SCHEDULER_NAMES = ("ddim", "dpm-multistep", "euler")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_REQUIRED = ("name", "config", "class_labels", "seed", "steps", "guidance_scale", "scheduler", "resolution")
_OPTIONAL = ("record_steps", "record_blocks", "tags", "repeat")


class CorpusError(ValueError):
    """The corpus file is missing, unparsable or has a bad field (the message names which)."""


@dataclass(frozen=True)
class CorpusCase:
    """One fixed input of the benchmark: what to sample and what to record."""

    name: str
    config: str
    class_labels: tuple[int, ...]
    seed: int
    steps: int
    guidance_scale: float
    scheduler: str
    resolution: int
    record_steps: tuple[int, ...] = ()
    record_blocks: tuple[int, ...] = ()
    tags: tuple[str, ...] = ()
    repeat: int = 1

    @property
    def labels(self) -> list[int]:
        """The label of every image sampled: ``class_labels`` cycled ``repeat`` times."""
        return list(self.class_labels) * self.repeat

    def sample_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :func:`dit_impl.baseline.sample`."""
        return dict(class_labels=self.labels, seed=self.seed, steps=self.steps,
                    guidance_scale=self.guidance_scale, scheduler=self.scheduler,
                    record_steps=self.record_steps, record_blocks=self.record_blocks)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_list(value: Any) -> bool:
    return isinstance(value, list) and all(_is_int(v) for v in value)


def _validate(raw: dict[str, Any], where: str) -> CorpusCase:
    def bad(field: str, need: str) -> CorpusError:
        return CorpusError(f"{where}: field {field!r} must be {need}, got {raw.get(field)!r}")

    unknown = sorted(set(raw) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise CorpusError(f"{where}: unknown field(s) {', '.join(map(repr, unknown))}; known: {', '.join(_REQUIRED + _OPTIONAL)}")
    missing = [field for field in _REQUIRED if field not in raw]
    if missing:
        raise CorpusError(f"{where}: missing field(s) {', '.join(map(repr, missing))}")
    if not isinstance(raw["name"], str) or not _NAME.match(raw["name"]):
        raise bad("name", "a string of letters, digits, '.', '-' or '_'")
    if raw["config"] not in CONFIGS:
        raise bad("config", f"one of {', '.join(sorted(CONFIGS))}")
    classes = CONFIGS[raw["config"]].num_classes
    labels = raw["class_labels"]
    if not _int_list(labels) or not labels or not all(0 <= v < classes for v in labels):
        raise bad("class_labels", f"a non-empty list of ints in 0..{classes - 1} (the classes of {raw['config']!r})")
    if not _is_int(raw["seed"]) or raw["seed"] < 0:
        raise bad("seed", "an int >= 0")
    if not _is_int(raw["steps"]) or raw["steps"] < 1:
        raise bad("steps", "an int >= 1")
    scale = raw["guidance_scale"]
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or scale < 0:
        raise bad("guidance_scale", "a number >= 0")
    if raw["scheduler"] not in SCHEDULER_NAMES:
        raise bad("scheduler", f"one of {', '.join(SCHEDULER_NAMES)}")
    config = CONFIGS[raw["config"]]
    if raw["resolution"] != config.resolution:
        raise bad("resolution", f"{config.resolution} (the resolution of config {config.name!r})")
    steps = raw["steps"]
    record_steps = raw.get("record_steps", [])
    if not _int_list(record_steps) or not all(-steps <= v < steps for v in record_steps):
        raise bad("record_steps", f"a list of step indices in {-steps}..{steps - 1}")
    record_blocks = raw.get("record_blocks", [])
    if not _int_list(record_blocks) or not all(0 <= v < config.num_layers for v in record_blocks):
        raise bad("record_blocks", f"a list of block indices in 0..{config.num_layers - 1}")
    tags = raw.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise bad("tags", "a list of strings")
    repeat = raw.get("repeat", 1)
    if not _is_int(repeat) or repeat < 1:
        raise bad("repeat", "an int >= 1")
    return CorpusCase(name=raw["name"], config=raw["config"], class_labels=tuple(labels), seed=raw["seed"],
                      steps=steps, guidance_scale=float(scale), scheduler=raw["scheduler"],
                      resolution=raw["resolution"], record_steps=tuple(record_steps),
                      record_blocks=tuple(record_blocks), tags=tuple(tags), repeat=repeat)


def load_corpus(path: str | Path = DEFAULT_CORPUS) -> list[CorpusCase]:
    """All cases of the corpus file, validated; raises :class:`CorpusError` naming the file and field."""
    file = Path(path)
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CorpusError(f"{file}: corpus file not found") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise CorpusError(f"{file}: cannot parse TOML ({exc})") from None
    if data.get("version") != 1:
        raise CorpusError(f"{file}: field 'version' must be 1, got {data.get('version')!r}")
    defaults = data.get("defaults", {})
    cases = data.get("case")
    if not isinstance(defaults, dict):
        raise CorpusError(f"{file}: [defaults] must be a table")
    if not isinstance(cases, list) or not cases:
        raise CorpusError(f"{file}: no [[case]] entries")
    result: list[CorpusCase] = []
    seen: set[str] = set()
    for number, raw in enumerate(cases, start=1):
        label = raw.get("name") if isinstance(raw.get("name"), str) else f"#{number}"
        case = _validate({**defaults, **raw}, f"{file}: case {label!r}")
        if case.name in seen:
            raise CorpusError(f"{file}: case {case.name!r}: field 'name' is used twice")
        seen.add(case.name)
        result.append(case)
    return result


def select(cases: list[CorpusCase], *, config: str | None = None, tag: str | None = None) -> list[CorpusCase]:
    """The cases of one config and/or carrying one tag, in corpus order."""
    return [c for c in cases if (config is None or c.config == config) and (tag is None or tag in c.tags)]
