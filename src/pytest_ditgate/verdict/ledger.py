"""The experiment ledger: ``results.tsv`` (the autoresearch loop's columns), ``experiments.jsonl`` (full
detail) and the best record per lane and arch. Appends are locked single writes; the best file is
replaced atomically and only on KEEP."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pytest_ditgate.fsutil import append_jsonl, atomic_write_json, lock_for, read_jsonl

TSV_COLUMNS = ("timestamp", "commit", "parent", "status", "class", "objective_metric", "best_before",
               "candidate", "improvement_pct", "peak_vram_gb", "quality", "description")
RESULTS_TSV = "results.tsv"
EXPERIMENTS_JSONL = "experiments.jsonl"
BEST_DIR = "best"


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


def _best_path(root: Path, lane: str, arch: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{lane}__{arch}")
    return root / BEST_DIR / f"{safe}.json"


def load_best(root: Path, lane: str, arch: str) -> dict[str, Any] | None:
    """The lane's current best on this arch, or None (an unreadable file is reported, not trusted)."""
    path = _best_path(root, lane, arch)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"best record {path} is corrupt ({exc}); remove it to restart the lane") from None


def store_best(root: Path, lane: str, arch: str, record: dict[str, Any]) -> Path:
    """Replace the lane's best (call only on KEEP); the record keeps its raw samples."""
    path = _best_path(root, lane, arch)
    with lock_for(path):
        atomic_write_json(path, record)
    return path
