"""The benchmark ledger: one JSON line per measurement or comparison under ``<artefact_dir>/bench.jsonl``.

Appends go through ``fsutil.append_jsonl`` (file lock, one ``write`` per line), so pytest-xdist workers
never tear or lose each other's lines. A recorded best is a *ratio* to a reference measured in the same
run, kept per (test, arch, lane) and only looked up under the same driver and torch.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import warnings

from pytest_ditgate.fsutil import (LedgerWarning, append_jsonl, ensure_gitignore, line_list, read_jsonl,
                                   read_jsonl_report)
from pytest_ditgate.numbers import finite_number

if TYPE_CHECKING:
    from pytest_ditgate.bench.comparison import Comparison
    from pytest_ditgate.bench.measurement import Measurement

LEDGER_FILE = "bench.jsonl"
SCHEMA = 1


def _worker() -> str | None:
    return os.environ.get("PYTEST_XDIST_WORKER")


class Ledger:
    """Append-only JSONL store of measurements and comparisons."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def append(self, record: dict[str, Any]) -> dict[str, Any]:
        if not self.path.parent.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            ensure_gitignore(self.path.parent)
        append_jsonl(self.path, record)
        return record

    def record_measurement(self, m: Measurement, *, test: str, lane: str,
                           profiles: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """One measurement line; ``profiles``: its phase profiles (``PhaseProfile.to_dict()``), if taken."""
        record = {"kind": "measurement", "schema": SCHEMA, "test": test, "lane": lane, "worker": _worker(),
                  "arch": m.arch, "driver": m.driver, "torch": m.torch, "measurement": m.to_dict()}
        if profiles:
            record["profiles"] = list(profiles)
        return self.append(record)

    def record_comparison(self, c: Comparison, *, test: str, lane: str, min_speedup: float | None = None,
                          passed: bool | None = None, profiles: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """One comparison line; ``profiles``: the phase profiles of candidate and reference, if taken."""
        record = {"kind": "comparison", "schema": SCHEMA, "test": test, "lane": lane, "worker": _worker(),
                  "arch": c.a.arch, "driver": c.a.driver, "torch": c.a.torch, "mechanism": c.a.mechanism,
                  "ratio": c.ratio, "ci_low": c.ci_low, "ci_high": c.ci_high, "confidence": c.confidence,
                  "method": c.method, "min_speedup": min_speedup, "passed": passed, "comparison": c.to_dict()}
        if profiles:
            record["profiles"] = list(profiles)
        return self.append(record)

    def read(self) -> tuple[list[dict[str, Any]], list[int]]:
        """All records and the line numbers that did not parse."""
        return read_jsonl(self.path)

    def comparisons(self) -> list[dict[str, Any]]:
        """Every well-formed comparison record; lines that are not JSON objects, and comparison records of
        the wrong shape (no finite ``ratio``/``ci_low``/``ci_high``), are skipped with a :class:`LedgerWarning`."""
        content = read_jsonl_report(self.path)
        problems = [content.skipped_message()] if content.bad else []
        good, shapeless = [], []
        for record, number in zip(content.records, content.line_numbers):
            if record.get("kind") != "comparison":
                continue
            if well_formed_comparison(record):
                good.append(record)
            else:
                shapeless.append(number)
        if shapeless:
            problems.append(f"{self.path}: skipped {len(shapeless)} comparison record(s) without a finite ratio, "
                            f"ci_low and ci_high ({line_list(shapeless)})")
        for problem in problems:
            warnings.warn(LedgerWarning(problem), stacklevel=3)
        return good

    def best(self, *, test: str, arch: str, lane: str, driver: str | None, torch: str | None) -> dict[str, Any] | None:
        """The passed comparison with the lowest ratio for (test, arch, lane) under the same driver and torch.

        Records from another arch, driver or torch are never returned: their ratios are not comparable.
        """
        matching = [r for r in self.comparisons() if r.get("test") == test
                    and r.get("arch") == arch and r.get("lane") == lane and r.get("driver") == driver
                    and r.get("torch") == torch and r.get("passed") is not False]
        return min(matching, key=lambda r: float(r["ratio"]), default=None)


def well_formed_comparison(record: dict[str, Any]) -> bool:
    """A comparison record the report and the best lookup can use: finite ratio and interval, str names."""
    return (all(finite_number(record.get(key)) for key in ("ratio", "ci_low", "ci_high"))
            and isinstance(record.get("test", ""), str) and isinstance(record.get("lane", ""), str))
