"""The experiment ledger: ``results.tsv`` (the autoresearch loop's columns) and ``experiments.jsonl``
(full detail), for people and reports. Appends are locked single writes. A lane's best is NOT kept here:
it lives in the lane's hash-chained history (:mod:`pytest_ditgate.experiment.history`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pytest_ditgate.fsutil import append_jsonl, lock_for, read_jsonl

TSV_COLUMNS = ("timestamp", "commit", "parent", "status", "class", "objective_metric", "best_before",
               "candidate", "improvement_pct", "peak_vram_gb", "quality", "description")
RESULTS_TSV = "results.tsv"
EXPERIMENTS_JSONL = "experiments.jsonl"


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return re.sub(r"[\t\r\n]+", " ", str(value))


def append_experiment(root: Path, row: dict[str, Any], detail: dict[str, Any]) -> None:
    """Append one experiment to ``results.tsv`` (header written once) and ``experiments.jsonl``."""
    tsv = root / RESULTS_TSV
    root.mkdir(parents=True, exist_ok=True)
    with lock_for(tsv):
        new = not tsv.exists() or tsv.stat().st_size == 0
        with tsv.open("a", encoding="utf-8") as handle:
            if new:
                handle.write("\t".join(TSV_COLUMNS) + "\n")
            handle.write("\t".join(_cell(row.get(column)) for column in TSV_COLUMNS) + "\n")
    append_jsonl(root / EXPERIMENTS_JSONL, detail)


def read_results(root: Path) -> list[dict[str, str]]:
    """Rows of ``results.tsv`` as dicts (empty when absent)."""
    tsv = root / RESULTS_TSV
    if not tsv.exists():
        return []
    lines = tsv.read_text(encoding="utf-8").splitlines()
    if not lines:
        return []
    header = lines[0].split("\t")
    return [dict(zip(header, line.split("\t"))) for line in lines[1:] if line.strip()]


def read_experiments(root: Path) -> list[dict[str, Any]]:
    return read_jsonl(root / EXPERIMENTS_JSONL)[0]
