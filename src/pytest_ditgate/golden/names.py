"""Which of a candidate's tensors a golden compares: one rule for a test's golden check (``session.py``) and the
judge's (``experiment/evidence.py``).

Golden tensors matching an ``optional`` glob may be absent from the candidate (diagnostics it cannot produce:
block activations under a CUDA graph); every other golden tensor is required, and a candidate tensor the golden
lacks fails too. No tensor is dropped silently.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class NameMatch:
    shared: tuple[str, ...]  # compared
    missing: tuple[str, ...]  # required golden tensors the candidate lacks
    not_compared: tuple[str, ...]  # optional golden tensors the candidate lacks
    extra: tuple[str, ...]  # candidate tensors the golden lacks

    @property
    def ok(self) -> bool:
        return bool(self.shared) and not self.missing and not self.extra

    def failures(self) -> list[str]:
        """One ``FAIL`` line per name problem (empty when the names match)."""
        lines = ([f"FAIL {n}: missing from the candidate (required)" for n in self.missing]
                 + [f"FAIL {n}: not in the golden (refreeze to add it)" for n in self.extra])
        if not self.shared:
            lines.append("FAIL: no tensor in common with the golden: nothing was compared")
        return lines


def match_names(golden: Iterable[str], candidate: Iterable[str], optional: Iterable[str] = ()) -> NameMatch:
    golden, candidate, optional = set(golden), set(candidate), [str(p) for p in optional]
    absent = sorted(golden - candidate)
    not_compared = tuple(n for n in absent if any(fnmatch.fnmatchcase(n, p) for p in optional))
    return NameMatch(shared=tuple(sorted(golden & candidate)),
                     missing=tuple(n for n in absent if n not in not_compared),
                     not_compared=not_compared, extra=tuple(sorted(candidate - golden)))
