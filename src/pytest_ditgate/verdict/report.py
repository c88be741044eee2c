"""The HTML report of a ledger folder: benchmark history per lane and arch, quality metrics, golden
error heat maps. Plots are matplotlib PNGs embedded as base64, so the page is one self-contained file."""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any

from pytest_ditgate.bench.ledger import LEDGER_FILE
from pytest_ditgate.fsutil import read_jsonl
from pytest_ditgate.verdict.ledger import read_experiments

HEATMAP_GLOB = "quality/**/*.png"
MAX_HEATMAPS = 24


def _png(fig: Any) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def history_plots(experiments: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(title, base64 PNG) per lane and arch: the objective ratio of each experiment, kept ones marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for record in experiments:
        verdict = record.get("verdict", {})
        lane = verdict.get("lane")
        objective = verdict.get("objective")
        if lane and objective:
            series.setdefault((lane, record.get("arch") or "?"), []).append(record)
    plots = []
    for (lane, arch), records in sorted(series.items()):
        fig, ax = plt.subplots(figsize=(7, 3.2))
        xs = list(range(1, len(records) + 1))
        ratios = [r["verdict"]["objective"]["ratio"] for r in records]
        lows = [r["verdict"]["objective"]["ci_low"] for r in records]
        highs = [r["verdict"]["objective"]["ci_high"] for r in records]
        kept = [r["verdict"]["label"] == "keep" for r in records]
        ax.vlines(xs, lows, highs, color="0.6", linewidth=2, label="CI")
        ax.scatter([x for x, k in zip(xs, kept) if k], [y for y, k in zip(ratios, kept) if k], color="tab:green",
                   zorder=3, label="keep")
        ax.scatter([x for x, k in zip(xs, kept) if not k], [y for y, k in zip(ratios, kept) if not k],
                   color="tab:red", marker="x", zorder=3, label="discard / crash")
        best, running = [], None
        for ratio, keep in zip(ratios, kept):
            if keep:
                running = ratio
            best.append(running)
        ax.step(xs, [b if b is not None else float("nan") for b in best], where="post", color="tab:blue",
                label="lane best")
        ax.set_xlabel("experiment")
        ax.set_ylabel("time ratio vs baseline")
        ax.set_title(f"lane {lane} on {arch}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        plots.append((f"{lane} / {arch}", _png(fig)))
    return plots


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_report(root: Path) -> str:
    """The whole HTML page for ledger folder ``root``."""
    experiments = read_experiments(root)
    records, _ = read_jsonl(root / LEDGER_FILE)
    measurements = [r["measurement"] for r in records if r.get("kind") == "measurement"]
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>ditgate report</title><style>",
             "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
             "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}th{background:#eee}"
             ".keep{color:green}.discard,.crash{color:#b00}img{max-width:100%}",
             "</style></head><body><h1>ditgate report</h1>"]
    parts.append(f"<p>{len(experiments)} experiments, {len(measurements)} measurements.</p>")
    parts.append("<h2>Benchmark history</h2>")
    plots = history_plots(experiments)
    if not plots:
        parts.append("<p>No experiment with a side-by-side speed objective yet.</p>")
    for title, png in plots:
        parts.append(f"<h3>{html.escape(title)}</h3><img alt='history {html.escape(title)}' src='data:image/png;base64,{png}'>")
    parts.append("<h2>Experiments</h2>")
    rows = []
    for record in experiments[-200:]:
        verdict = record.get("verdict", {})
        objective = verdict.get("objective") or {}
        rows.append([record.get("time_utc", ""), record.get("commit") or "", verdict.get("lane") or "",
                     record.get("arch") or "", verdict.get("label", ""), verdict.get("experiment_class", ""),
                     f"{objective['ratio']:.4f}" if objective else "", (verdict.get("reasons") or [""])[0][:160],
                     record.get("description", "")])
    parts.append(_table(["time", "commit", "lane", "arch", "verdict", "class", "ratio", "first reason",
                         "description"], rows))
    parts.append("<h2>Quality metrics</h2>")
    quality_rows = []
    for record in experiments[-50:]:
        for case in record.get("quality", []):
            metrics = ", ".join(f"{k}={v:.4g}" if isinstance(v, (int, float)) else f"{k}={v}"
                                for k, v in sorted((case.get("metrics") or {}).items()))
            quality_rows.append([record.get("commit") or "", case.get("case", case.get("test", "")),
                                 "pass" if case.get("passed", True) else "FAIL", metrics[:400]])
    parts.append(_table(["commit", "case", "status", "metrics"], quality_rows) if quality_rows
                 else "<p>No quality results recorded.</p>")
    parts.append("<h2>Golden error heat maps</h2>")
    maps = sorted(root.glob(HEATMAP_GLOB))[-MAX_HEATMAPS:]
    if not maps:
        parts.append("<p>No failure images (every quality check passed, or none ran).</p>")
    for path in maps:
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        name = html.escape(str(path.relative_to(root)))
        parts.append(f"<figure><img alt='{name}' src='data:image/png;base64,{data}'><figcaption>{name}</figcaption></figure>")
    parts.append("<h2>Measurements</h2>")
    mrows = [[m.get("label") or "", m.get("backend") or "", f"{m.get('median_ms', float('nan')):.5f}",
              f"{m.get('cv', float('nan')):.3%}" if isinstance(m.get("cv"), (int, float)) else "",
              m.get("n", ""), m.get("mechanism", ""), m.get("arch", "")] for m in measurements[-200:]]
    parts.append(_table(["name", "backend", "median ms", "CV", "n", "mechanism", "arch"], mrows) if mrows
                 else "<p>No measurements recorded.</p>")
    parts.append("</body></html>")
    return "\n".join(parts)
