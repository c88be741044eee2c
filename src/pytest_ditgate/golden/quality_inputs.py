"""The quality inputs a golden is frozen with: the kinds of its tensors and the labels of its images.

A test passes them to ``golden.check(..., quality_inputs=...)`` beside its ``compare``. The freeze stores their
plain-data part in the entry's provenance, so that a judge in another process judges a candidate's tensors
as the test did, from what the baseline froze and never from what the candidate's process writes.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

#: the provenance key of a golden entry that holds its frozen quality inputs
PROVENANCE_KEY = "quality"


def quality_record(inputs: Mapping[str, Any] | None) -> dict[str, Any]:
    """The plain-data part of ``quality_inputs``: tensor kinds and image labels (models and the like dropped)."""
    inputs = dict(inputs or {})
    out: dict[str, Any] = {}
    if inputs.get("kinds"):
        out["kinds"] = {str(k): str(v) for k, v in dict(inputs["kinds"]).items()}
    if inputs.get("labels") is not None:
        out["labels"] = [int(label) for label in inputs["labels"]]
    return out


def frozen_record(provenance: Mapping[str, Any]) -> dict[str, Any]:
    """The quality inputs frozen with a golden (empty for a golden frozen without any)."""
    record = provenance.get(PROVENANCE_KEY)
    return quality_record(record) if isinstance(record, Mapping) else {}


def for_tensors(record: Mapping[str, Any], names: Iterable[str]) -> dict[str, Any]:
    """``kinds`` (only of the tensors judged, None when none) and ``labels`` of a record, as the quality
    gate takes them."""
    names = set(names)
    kinds = {name: kind for name, kind in dict(record.get("kinds") or {}).items() if name in names}
    return {"kinds": kinds or None, "labels": record.get("labels")}


def disagreement(given: Mapping[str, Any], frozen: Mapping[str, Any], names: Iterable[str]) -> str | None:
    """Why the test's quality inputs differ from the golden's over the tensors judged (None when they agree).

    A judge reads the frozen ones, so the two must agree for the judge to judge as the test does."""
    names = sorted(set(names))
    ours, theirs = for_tensors(given, names), for_tensors(frozen, names)
    kinds, frozen_kinds = ours["kinds"] or {}, theirs["kinds"] or {}
    differ = [f"{name}: {kinds.get(name, 'unset')} here, {frozen_kinds.get(name, 'unset')} in the golden"
              for name in names if kinds.get(name) != frozen_kinds.get(name)]
    if ours["labels"] != theirs["labels"]:
        differ.append(f"labels: {_shown(ours['labels'])} here, {_shown(theirs['labels'])} in the golden")
    return "; ".join(differ) or None


def _shown(labels: list[int] | None) -> str:
    if labels is None:
        return "none"
    head = ", ".join(str(label) for label in labels[:6])
    return f"{len(labels)} [{head}{', ...' if len(labels) > 6 else ''}]"
