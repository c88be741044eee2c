"""``Measurement``: the samples of one timed function with their statistics and full provenance.

A number without its provenance cannot be compared, so every field a comparison needs (device, arch,
driver, CUDA, torch, which timer measured, which regime, L2 mode) travels with the samples and
survives a JSON round trip. Torch-free.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from dataclasses import dataclass, field
from typing import Any

from pytest_ditgate.bench.stats import summarize

#: each call after the device went idle / calls back to back keeping the device busy
REGIMES = ("spaced", "sustained")
SCHEMA = 1


@dataclass(frozen=True)
class Measurement:
    """Samples (milliseconds per call) and the statistics and provenance of one measurement."""

    samples_ms: tuple[float, ...]
    median_ms: float
    mean_ms: float
    stdev_ms: float
    variance: float
    cv: float
    iqr_ms: float
    min_ms: float
    max_ms: float
    p95_ms: float
    n: int
    warmup: int
    mechanism: str
    regime: str
    l2_mode: str
    #: mechanism name -> why it was (or was not) used; the chosen one says why it was chosen
    mechanism_notes: dict[str, str] = field(default_factory=dict)
    #: calls averaged into one sample (graph replays many calls; 1 otherwise)
    calls_per_sample: int = 1
    device: str = "cpu"
    arch: str = "cpu"
    driver: str | None = None
    cuda: str | None = None
    torch: str | None = None
    triton: str | None = None
    clocks_start: dict[str, Any] | None = None
    clocks_end: dict[str, Any] | None = None
    backend: str | None = None
    shapes: Any = None
    dtype: str | None = None
    label: str | None = None
    time_utc: str = ""
    #: mechanism details: cupti ``span_median_ms``/``idle_fraction``, graph ``calls_per_replay``...
    extra: dict[str, Any] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        """Only for names that do not exist: ``m.median`` says the field is ``median_ms`` (times carry
        their unit in the name)."""
        if name.startswith("__"):
            raise AttributeError(name)
        import difflib

        fields = [f.name for f in dataclasses.fields(self)] + ["name"]
        close = difflib.get_close_matches(name, fields, n=1, cutoff=0.6)
        if not close and f"{name}_ms" in fields:
            close = [f"{name}_ms"]
        hint = f"; did you mean {close[0]}?" if close else ""
        raise AttributeError(f"'Measurement' object has no attribute {name!r}{hint} (times are in milliseconds, "
                             "named *_ms)")

    @classmethod
    def from_samples(cls, samples_ms: list[float] | tuple[float, ...], **fields: Any) -> "Measurement":
        """Build from raw samples; statistics are computed here, provenance comes in ``fields``."""
        summary = summarize(samples_ms)
        fields.setdefault("time_utc", _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
        return cls(
            samples_ms=tuple(float(x) for x in samples_ms),
            median_ms=summary.median,
            mean_ms=summary.mean,
            stdev_ms=summary.stdev,
            variance=summary.variance,
            cv=summary.cv,
            iqr_ms=summary.iqr,
            min_ms=summary.min,
            max_ms=summary.max,
            p95_ms=summary.p95,
            n=summary.n,
            **fields,
        )

    @property
    def name(self) -> str:
        return self.label or "measurement"

    def to_dict(self) -> dict[str, Any]:
        # a shallow copy: dataclasses.asdict deep-copies and costs more than the ledger write itself
        data = {name: getattr(self, name) for name in _FIELD_NAMES}
        data["samples_ms"] = list(self.samples_ms)
        data["mechanism_notes"] = dict(self.mechanism_notes)
        data["extra"] = dict(self.extra)
        data["schema"] = SCHEMA
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Measurement":
        """Inverse of :meth:`to_dict`; statistics are taken as stored (they were computed from the samples)."""
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        kwargs["samples_ms"] = tuple(float(x) for x in kwargs.get("samples_ms", ()))
        kwargs["shapes"] = as_tuples(kwargs.get("shapes"))
        return cls(**kwargs)


_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(Measurement))


def as_tuples(value: Any) -> Any:
    """Lists (also JSON's, which has no tuples) as tuples, recursively: shapes compare equal after a round trip."""
    if isinstance(value, (list, tuple)):
        return tuple(as_tuples(v) for v in value)
    if isinstance(value, dict):
        return {str(k): as_tuples(v) for k, v in value.items()}
    return value
