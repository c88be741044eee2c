"""Does a candidate match its golden? The default comparator: relative L2 and relative max error per tensor.

Limits depend on the dtype and are multiplied by the tolerance scale of the fallback step the golden came
from. A candidate whose dtype differs from the golden's fails, naming both: judged at the coarser dtype's
limits, a bf16 candidate would pass against a float32 golden with a 0.3 % error where float32 allows 0.04 %,
so the widening is made only when the check says so (``allow_dtype_change=True``). Any callable ``compare(candidate, hit) -> result`` with a
boolean ``passed`` (and optionally ``lines()``) can replace it, e.g. one built on the quality contract
(``pytest_ditgate.quality``); this module is the hook point for that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Protocol

from pytest_ditgate.arguments import clip
from pytest_ditgate.dtypes import dtype_name, least_precise

if TYPE_CHECKING:
    import torch

#: the longest tensor name a line shows whole
NAME_LIMIT = 80

#: dtype -> (relative L2 limit, relative max-error limit) at tolerance scale 1
DEFAULT_LIMITS: dict[str, tuple[float, float]] = {
    "float64": (1e-10, 1e-9),
    "float32": (1e-4, 1e-3),
    "float16": (1e-2, 5e-2),
    "bfloat16": (3e-2, 1e-1),
}


class GoldenTensors(Protocol):
    """What a comparator reads of the golden a lookup found (a ``GoldenHit`` of ``golden/session.py``)."""

    @property
    def tensors(self) -> Mapping[str, "torch.Tensor"]: ...

    @property
    def tolerance_scale(self) -> float: ...


@dataclass(frozen=True)
class TensorDiff:
    """One tensor's comparison: errors, the limits applied, and the verdict."""

    name: str
    passed: bool
    rel_l2: float = math.nan
    rel_max: float = math.nan
    limit_rel_l2: float = math.nan
    limit_rel_max: float = math.nan
    note: str = ""

    def line(self) -> str:
        """One line, bounded by construction (the tensor's name clipped), so that a failure message keeps the
        whole note: its remedy comes last."""
        verdict = "ok  " if self.passed else "FAIL"
        name = clip(self.name, NAME_LIMIT)
        if self.note:
            return f"{verdict} {name}: {self.note}"
        return (f"{verdict} {name}: rel_l2 {self.rel_l2:.3e} (limit {self.limit_rel_l2:.1e}), "
                f"rel_max {self.rel_max:.3e} (limit {self.limit_rel_max:.1e})")


@dataclass(frozen=True)
class Comparison:
    """The diffs of the tensors compared; ``passed`` only when every one is within limits."""

    diffs: tuple[TensorDiff, ...] = field(default_factory=tuple)

    @property
    def passed(self) -> bool:
        return all(d.passed for d in self.diffs)

    def lines(self) -> list[str]:
        return [d.line() for d in self.diffs]


def _as_real64(tensor: "torch.Tensor") -> "torch.Tensor":
    """``tensor`` on the CPU in float64; a complex one as its (real, imaginary) pairs, both judged (a cast to
    float64 would drop the imaginary part, and a wrong one would pass)."""
    import torch

    t = tensor.detach().to("cpu")
    if t.is_complex():
        return torch.view_as_real(t.to(torch.complex128))
    return t.to(torch.float64)


def _coarser(a: str, b: str) -> str:
    """The less precise of two dtype names that have default limits (``float32`` when neither has)."""
    return least_precise((a, b), among=DEFAULT_LIMITS) or "float32"


@dataclass(frozen=True)
class TensorComparator:
    """Relative-L2 and relative max-error limits per dtype (``limits`` overrides :data:`DEFAULT_LIMITS`)."""

    limits: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    exact_dtypes: bool = False  # True: a dtype change fails even when it is allowed
    #: judge a candidate of another dtype than the golden at the coarser dtype's limits (else: it fails)
    allow_dtype_change: bool = False

    def compare_tensor(self, name: str, candidate: "torch.Tensor", golden: "torch.Tensor", scale: float) -> TensorDiff:
        import torch

        if tuple(candidate.shape) != tuple(golden.shape):
            return TensorDiff(name, False, note=f"shape {tuple(candidate.shape)} != golden {tuple(golden.shape)}")
        if candidate.dtype != golden.dtype and (self.exact_dtypes or not self.allow_dtype_change):
            have, want = dtype_name(candidate.dtype), dtype_name(golden.dtype)
            hint = "" if self.exact_dtypes else (
                f": a dtype change is judged only when the check says so (golden.check(..., allow_dtype_change=True) "
                f"judges it at {_coarser(have, want)}'s limits), or refreeze the golden in {have}")
            return TensorDiff(name, False, note=f"dtype {have} != golden {want}{hint}")
        cand, gold = _as_real64(candidate), _as_real64(golden)
        if not torch.isfinite(cand).all():
            return TensorDiff(name, False, note="candidate has NaN or Inf")
        limits = {**DEFAULT_LIMITS, **dict(self.limits)}
        dtype = _coarser(dtype_name(candidate.dtype), dtype_name(golden.dtype))
        lim_l2, lim_max = (limit * scale for limit in limits.get(dtype, limits["float32"]))
        diff = cand - gold
        gold_norm, gold_max = float(gold.norm()), float(gold.abs().max()) if gold.numel() else 0.0
        rel_l2 = float(diff.norm()) / gold_norm if gold_norm > 0 else float(diff.norm())
        rel_max = float(diff.abs().max()) / gold_max if gold_max > 0 else float(diff.abs().max()) if diff.numel() else 0.0
        passed = rel_l2 <= lim_l2 and rel_max <= lim_max
        return TensorDiff(name, passed, rel_l2, rel_max, lim_l2, lim_max)

    def __call__(self, candidate: Mapping[str, "torch.Tensor"], hit: GoldenTensors) -> Comparison:
        """Diffs of the tensors both sides have (the session checks that the names agree)."""
        return Comparison(tuple(self.compare_tensor(name, candidate[name], hit.tensors[name], hit.tolerance_scale)
                                for name in sorted(set(candidate) & set(hit.tensors))))
