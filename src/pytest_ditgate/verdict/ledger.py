"""The experiment ledger: ``results.tsv`` (the autoresearch loop's columns), ``experiments.jsonl`` (full
detail), for people and reports, and a mirror of each lane's best per arch under ``best/`` that the judge
replaces atomically on KEEP for advisory ``--ditgate-lane`` runs. Appends are locked single writes. The
judge never reads the mirror: a lane's best lives in its hash-chained history
(:mod:`pytest_ditgate.experiment.history`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pytest_ditgate.fsutil import (CorruptFile, append_jsonl, append_line, atomic_write_json, lock_for,
                                   read_json_object, read_jsonl_report, skipped_message)
from pytest_ditgate.numbers import finite_number

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
    """Append one experiment to ``results.tsv`` (header written once) and ``experiments.jsonl``. Both go through
    :func:`~pytest_ditgate.fsutil.append_line`: a torn last row (a writer killed mid-line) is closed first, so the
    new row never glues onto it and drops out of ``ditgate summary``."""
    root.mkdir(parents=True, exist_ok=True)
    append_line(root / RESULTS_TSV, "\t".join(_cell(row.get(column)) for column in TSV_COLUMNS),
                header="\t".join(TSV_COLUMNS))
    append_jsonl(root / EXPERIMENTS_JSONL, detail)


def read_results(root: Path, skipped: list[str] | None = None) -> list[dict[str, str]]:
    """Rows of ``results.tsv`` as dicts (empty when absent). Rows that are not UTF-8 or do not have the
    header's number of cells are left out and named in ``skipped`` (one message), never guessed at."""
    tsv = root / RESULTS_TSV
    try:
        data = tsv.read_bytes()
    except FileNotFoundError:
        return []
    lines = data.split(b"\n")
    header = lines[0].decode("utf-8", "replace").rstrip("\r").split("\t")
    rows, bad = [], []
    for number, raw in enumerate(lines[1:], start=2):
        if not raw.strip():
            continue
        try:
            cells = raw.decode("utf-8").rstrip("\r").split("\t")
        except UnicodeDecodeError:
            bad.append(number)
            continue
        if len(cells) != len(header):
            bad.append(number)
            continue
        rows.append(dict(zip(header, cells)))
    message = skipped_message(tsv, bad, "row", f"not UTF-8 or not {len(header)} tab-separated cells")
    if message and skipped is not None:
        skipped.append(message)
    return rows


def read_experiments(root: Path, skipped: list[str] | None = None) -> list[dict[str, Any]]:
    """Records of ``experiments.jsonl``; unreadable lines are named in ``skipped``."""
    content = read_jsonl_report(root / EXPERIMENTS_JSONL)
    message = content.skipped_message()
    if message and skipped is not None:
        skipped.append(message)
    return content.records


def _best_path(root: Path, lane: str, arch: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{lane}__{arch}")
    return root / BEST_DIR / f"{safe}.json"


def load_best(root: Path, lane: str, arch: str) -> dict[str, Any] | None:
    """The lane's current best on this arch, or None (an unreadable file is reported, not trusted)."""
    path = _best_path(root, lane, arch)
    try:
        record = read_json_object(path, what="best record")
    except CorruptFile as exc:
        raise ValueError(f"{exc}; remove it to restart the lane") from None
    except OSError as exc:
        raise ValueError(f"best record {path} cannot be read ({exc}); remove it to restart the lane") from None
    if record is None:
        return None
    problem = _best_problem(record)
    if problem:
        raise ValueError(f"best record {path} is corrupt ({problem}); remove it to restart the lane")
    return record


def _best_problem(record: dict[str, Any]) -> str | None:
    """What makes a best record unusable (None when it has the objective a comparison needs)."""
    objective = record.get("objective")
    if not isinstance(objective, dict):
        return "no 'objective' object"
    for key in ("ratio", "ci_low", "ci_high"):
        value = objective.get(key)
        if not finite_number(value) or value <= 0:
            return f"objective.{key} must be a positive finite number, found {value!r}"
    if record.get("comparisons") is not None and not isinstance(record["comparisons"], list):
        return "'comparisons' must be a list"
    return None


def store_best(root: Path, lane: str, arch: str, record: dict[str, Any]) -> Path:
    """Replace the lane's best (call only on KEEP); the record keeps its raw samples."""
    path = _best_path(root, lane, arch)
    with lock_for(path):
        atomic_write_json(path, record)
    return path
