"""Inputs a golden must have been frozen with: the metadata that makes it this test's baseline.

A test names them with ``golden.check(..., metadata=..., frozen_with=("weights", "seed"))``. When the frozen
entry recorded another value for one of them (new weights, another seed), the golden is not this test's
baseline any more: the check fails as ``golden_stale`` naming the key and both values, instead of blaming
the tensors. Keys left out (dtype, device) may differ: a bf16 run is judged against an fp32 golden.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping


def plain(value: Any) -> Any:
    """``value`` as it reads back from the manifest (JSON: tuples become lists, unknown types strings)."""
    return json.loads(json.dumps(value, default=str))


def disagreement(given: Mapping[str, Any], frozen: Mapping[str, Any], keys: Iterable[str]) -> str | None:
    """Why ``given`` metadata differs from the ``frozen`` entry's over ``keys`` (None when it agrees).

    ``given`` holds every key (the session checks that first, in every mode); a key the golden was frozen
    without is not judged (it predates the key)."""
    differ = [f"{key}: {_shown(plain(given[key]))} here, {_shown(frozen[key])} in the golden"
              for key in keys if key in frozen and plain(given[key]) != frozen[key]]
    return "; ".join(differ) or None


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."
