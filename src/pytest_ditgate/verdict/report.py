"""The HTML report of a ledger folder: benchmark history per lane and arch, experiments, side-by-side
comparisons (``ditbench.pair``), phase profiles (``--ditgate-profile``), quality metrics, measurements
and golden error heat maps.

Plots are matplotlib PNGs embedded as base64, so the page is one self-contained file. Ledgers are read
defensively: a line that is not a JSON object, or a record of the wrong shape, is left out and *counted*
in the page's notes (and by ``ditgate report`` on stderr), never a crash. Without matplotlib the page is
written without plots, saying so.
"""

from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_ditgate.bench.ledger import LEDGER_FILE, well_formed_comparison
from pytest_ditgate.fsutil import line_list, read_jsonl_report
from pytest_ditgate.numbers import finite_number
from pytest_ditgate.verdict.ledger import EXPERIMENTS_JSONL

HEATMAP_GLOB = "quality/**/*.png"
MAX_HEATMAPS = 24
NO_MATPLOTLIB = "matplotlib is not installed: the history plots are left out (pip install matplotlib)"
NO_PHASE_BARS = "matplotlib is not installed: the phase bars are left out (pip install matplotlib)"
MAX_PROFILES = 40


@dataclass
class ReportPage:
    """The rendered page and what had to be left out (one readable line each)."""

    html: str
    notes: list[str] = field(default_factory=list)


def _num(value: Any) -> float | None:
    """``value`` as a finite float, or None (bools, strings, NaN and inf are not numbers here)."""
    return float(value) if finite_number(value) else None


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _objective(record: dict[str, Any]) -> dict[str, float] | None:
    """The experiment's speed objective (ratio and interval), when it has a well-formed one."""
    objective = _obj(_obj(record.get("verdict")).get("objective"))
    values = {key: _num(objective.get(key)) for key in ("ratio", "ci_low", "ci_high")}
    return values if all(v is not None for v in values.values()) else None  # type: ignore[return-value]


def _png(fig: Any) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def history_plots(experiments: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(title, base64 PNG) per lane and arch: the objective ratio of each experiment, kept ones marked.

    Raises ImportError without matplotlib (the caller says so on the page)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[tuple[str, str], list[tuple[dict[str, float], bool]]] = {}
    for record in experiments:
        verdict = _obj(record.get("verdict"))
        lane, objective = verdict.get("lane"), _objective(record)
        if isinstance(lane, str) and lane and objective:
            series.setdefault((lane, _text(record.get("arch")) or "?"), []).append(
                (objective, verdict.get("label") == "keep"))
    plots = []
    for (lane, arch), points in sorted(series.items()):
        fig, ax = plt.subplots(figsize=(7, 3.2))
        xs = list(range(1, len(points) + 1))
        ratios = [p["ratio"] for p, _ in points]
        kept = [k for _, k in points]
        ax.vlines(xs, [p["ci_low"] for p, _ in points], [p["ci_high"] for p, _ in points], color="0.6",
                  linewidth=2, label="CI")
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


def _fmt(value: Any, spec: str) -> str:
    number = _num(value)
    return "" if number is None else format(number, spec)


class _Record(dict):
    """A ledger record that remembers its line number, so a note can name the records it left out."""

    line: int | None = None


def _read(path: Path, notes: list[str]) -> list[dict[str, Any]]:
    content = read_jsonl_report(path)
    message = content.skipped_message()
    if message:
        notes.append(message)
    records = []
    for record, number in zip(content.records, content.line_numbers):
        wrapped = _Record(record)
        wrapped.line = number
        records.append(wrapped)
    return records


def _at(records: list[Any]) -> str:
    """``(lines 3, 7)``: where the records a note leaves out are."""
    return f"({line_list([n for n in (getattr(r, 'line', None) for r in records) if n is not None])})"


def _experiment_rows(experiments: list[dict[str, Any]]) -> list[list[Any]]:
    rows = []
    for record in experiments[-200:]:
        verdict = _obj(record.get("verdict"))
        objective = _objective(record)
        reasons = verdict.get("reasons")
        first = reasons[0] if isinstance(reasons, list) and reasons else ""
        rows.append([_text(record.get("time_utc")), _text(record.get("commit")), _text(verdict.get("lane")),
                     _text(record.get("arch")), _text(verdict.get("label")), _text(verdict.get("experiment_class")),
                     f"{objective['ratio']:.4f}" if objective else "", _text(first)[:160],
                     _text(record.get("description"))])
    return rows


def _quality_rows(experiments: list[dict[str, Any]]) -> list[list[Any]]:
    rows = []
    for record in experiments[-50:]:
        cases = record.get("quality")
        for case in cases if isinstance(cases, list) else []:
            case = _obj(case)
            metrics = ", ".join(f"{k}={v:.4g}" if _num(v) is not None else f"{k}={v}"
                                for k, v in sorted(_obj(case.get("metrics")).items()))
            rows.append([_text(record.get("commit")), _text(case.get("case", case.get("test", ""))),
                         "pass" if case.get("passed", True) else "FAIL", metrics[:400]])
    return rows


def _comparison_rows(records: list[dict[str, Any]], notes: list[str], path: Path) -> list[list[Any]]:
    """One row per ``ditbench.pair`` comparison in the bench ledger (the latest 200)."""
    comparisons = [r for r in records if r.get("kind") == "comparison"]
    good = [r for r in comparisons if well_formed_comparison(r)]
    if len(good) < len(comparisons):
        left = [r for r in comparisons if not well_formed_comparison(r)]
        notes.append(f"{path}: left out {len(left)} comparison record(s) without a finite ratio, ci_low and "
                     f"ci_high {_at(left)}")
    rows = []
    for r in good[-200:]:
        sides = _obj(r.get("comparison"))
        pair = " / ".join(_text(side.get("label") or side.get("name"))
                          for side in (_obj(sides.get("a")), _obj(sides.get("b"))))
        verdict = {True: "PASS", False: "FAIL"}.get(r.get("passed"),
                                                    "judged by the lane" if r.get("min_speedup") is None else "")
        rows.append([_text(r.get("test")).rsplit("::", 1)[-1], pair.strip(" /"), _text(r.get("lane")),
                     f"{r['ratio']:.4f}", f"[{r['ci_low']:.4f}, {r['ci_high']:.4f}]", _fmt(r.get("min_speedup"), ".1%"),
                     verdict, _text(r.get("mechanism")), _text(r.get("arch"))])
    return rows


def _measurement_rows(records: list[dict[str, Any]], notes: list[str], path: Path) -> list[list[Any]]:
    raw = [r for r in records if r.get("kind") == "measurement"]
    measurements = [r["measurement"] for r in raw if isinstance(r.get("measurement"), dict)]
    if len(measurements) < len(raw):
        left = [r for r in raw if not isinstance(r.get("measurement"), dict)]
        notes.append(f"{path}: left out {len(left)} measurement record(s) without a 'measurement' object "
                     f"{_at(left)}")
    return [[_text(m.get("label")), _text(m.get("backend")), _fmt(m.get("median_ms"), ".5f"),
             _fmt(m.get("cv"), ".3%"), _text(m.get("n")), _text(m.get("mechanism")), _text(m.get("arch"))]
            for m in measurements[-200:]]


def _phase_profiles(records: list[dict[str, Any]], notes: list[str], path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(test, profile) for the phase profiles recorded with measurements and comparisons (the latest
    MAX_PROFILES); a profile without a finite span and per-phase times is left out and counted."""
    from pytest_ditgate.bench.phases import PHASES

    found, bad, where = [], 0, []
    for record in records:
        profiles = record.get("profiles")
        if profiles is None:
            continue
        for profile in profiles if isinstance(profiles, list) else [None]:
            profile = _obj(profile)
            phases = _obj(profile.get("phases"))
            usable = (_num(profile.get("span_ms")) is not None
                      and all(_num(_obj(phases.get(p)).get("ms")) is not None for p in PHASES)) if phases else (
                          profile.get("source") in ("none", "unavailable"))
            if usable:
                found.append((_text(record.get("test")), profile))
            else:
                bad += 1
                if not where or where[-1] is not record:
                    where.append(record)
    if bad:
        notes.append(f"{path}: left out {bad} phase profile(s) without a finite span and per-phase times "
                     f"{_at(where)}")
    return found[-MAX_PROFILES:]


def _profile_rows(profiles: list[tuple[str, dict[str, Any]]]) -> list[list[Any]]:
    from pytest_ditgate.bench.phases import PHASES
    from pytest_ditgate.bench.report import kernel_rate, profile_name, rate_withheld

    rows = []
    for test, profile in profiles:
        phases = _obj(profile.get("phases"))
        kernels = profile.get("kernels") if isinstance(profile.get("kernels"), list) else []
        top = _obj(kernels[0]) if kernels else {}
        gemm = _obj(profile.get("gemm"))
        gemm_text = "" if rate_withheld(gemm) else _fmt(gemm.get("tflops"), ".1f")
        if gemm_text and _num(gemm.get("peak_fraction")) is not None:
            gemm_text += f" ({gemm['peak_fraction']:.0%} of {_text(gemm.get('dtype'))} peak)"
        notes = profile.get("notes") if isinstance(profile.get("notes"), list) else []
        rows.append([profile_name(test, profile), _text(profile.get("source")), _text(profile.get("arch")),
                     _fmt(profile.get("span_ms"), ".4f")]
                    + [_fmt(_obj(phases.get(p)).get("share"), ".1%") for p in PHASES]
                    + [_fmt(profile.get("timed_ms"), ".4f"), _fmt(_obj(profile.get("timed_idle")).get("share"), ".1%")]
                    + [(f"{_text(top.get('name'))[:90]} {_fmt(top.get('ms'), '.4f')} ms {kernel_rate(top)}".strip()
                        if top else ""), gemm_text, _text(profile.get("trace")), "; ".join(map(_text, notes))[:300]])
    return rows


def phase_plot(profiles: list[tuple[str, dict[str, Any]]]) -> str | None:
    """A base64 PNG: one stacked bar per profile, ms per phase; None without profiles with phases.

    Raises ImportError without matplotlib (the caller says so on the page)."""
    from pytest_ditgate.bench.phases import LABELS, PHASES
    from pytest_ditgate.bench.report import profile_name

    shown = [(test, p) for test, p in profiles if _obj(p.get("phases"))]
    if not shown:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 0.45 * len(shown) + 1.4))
    names = [profile_name(test, p) for test, p in shown]
    left = [0.0] * len(shown)
    for phase in PHASES:
        widths = [float(_obj(_obj(p["phases"]).get(phase)).get("ms") or 0.0) for _, p in shown]
        ax.barh(names, widths, left=left, label=LABELS[phase])
        left = [a + b for a, b in zip(left, widths)]
    ax.set_xlabel("ms in the traced call")
    ax.invert_yaxis()
    ax.legend(fontsize=8, ncol=3, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def _heatmaps(root: Path, notes: list[str]) -> list[str]:
    parts = []
    for path in sorted(root.glob(HEATMAP_GLOB))[-MAX_HEATMAPS:]:
        try:
            data = base64.b64encode(path.read_bytes()).decode("ascii")
        except OSError as exc:
            notes.append(f"{path}: cannot read ({exc.strerror or exc}); left out")
            continue
        name = html.escape(str(path.relative_to(root)))
        parts.append(f"<figure><img alt='{name}' src='data:image/png;base64,{data}'><figcaption>{name}</figcaption></figure>")
    return parts


def _phase_section(profiles: list[tuple[str, dict[str, Any]]]) -> list[str]:
    from pytest_ditgate.bench.phases import LABELS, PHASES

    parts = ["<h2>Phase profiles</h2>"]
    if not profiles:
        return parts + ["<p>No phase profiles recorded (run with --ditgate-profile or ditbench(..., profile=True)).</p>"]
    try:
        png = phase_plot(profiles)
    except ImportError:
        parts.append(f"<p>{html.escape(NO_PHASE_BARS)}.</p>")
    else:
        if png is not None:
            parts.append(f"<img alt='phase bars' src='data:image/png;base64,{png}'>")
    parts.append(_table(["profile", "source", "arch", "traced ms"] + [LABELS[p] for p in PHASES if p != "idle"]
                        + ["idle / traced span", "timed ms", "idle / timed median", "top kernel", "GEMM TFLOP/s",
                           "trace", "notes"], _profile_rows(profiles)))
    return parts


def build_report(root: Path) -> ReportPage:
    """The page for ledger folder ``root`` and the notes on what was left out."""
    notes: list[str] = []
    experiments = _read(root / EXPERIMENTS_JSONL, notes)
    bench_path = root / LEDGER_FILE
    records = _read(bench_path, notes)
    measurement_rows = _measurement_rows(records, notes, bench_path)
    comparison_rows = _comparison_rows(records, notes, bench_path)
    profiles = _phase_profiles(records, notes, bench_path)
    try:
        plots = history_plots(experiments)
    except ImportError:
        plots = None
        notes.append(NO_MATPLOTLIB)
    heatmaps = _heatmaps(root, notes)
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>ditgate report</title><style>",
             "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
             "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}th{background:#eee}"
             ".keep{color:green}.discard,.crash{color:#b00}img{max-width:100%}.notes{color:#850}",
             "</style></head><body><h1>ditgate report</h1>"]
    parts.append(f"<p>{len(experiments)} experiments, {len(measurement_rows)} measurements.</p>"
                 f"<p>{len(comparison_rows)} side-by-side comparisons, {len(profiles)} phase profiles.</p>")
    if notes:
        parts.append("<ul class='notes'>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    parts.append("<h2>Benchmark history</h2>")
    if plots is None:
        parts.append(f"<p>{html.escape(NO_MATPLOTLIB)}.</p>")
    elif not plots:
        parts.append("<p>No experiment with a side-by-side speed objective yet.</p>")
    for title, png in plots or []:
        parts.append(f"<h3>{html.escape(title)}</h3><img alt='history {html.escape(title)}' src='data:image/png;base64,{png}'>")
    parts.append("<h2>Experiments</h2>")
    parts.append(_table(["time", "commit", "lane", "arch", "verdict", "class", "ratio", "first reason",
                         "description"], _experiment_rows(experiments)))
    parts.append("<h2>Side-by-side comparisons</h2>")
    parts.append(_table(["test", "candidate / reference", "lane", "ratio", "CI", "min speedup", "verdict",
                         "mechanism", "arch"], comparison_rows) if comparison_rows
                 else "<p>No ditbench.pair comparisons recorded.</p>")
    parts += _phase_section(profiles)
    parts.append("<h2>Quality metrics</h2>")
    quality_rows = _quality_rows(experiments)
    parts.append(_table(["commit", "case", "status", "metrics"], quality_rows) if quality_rows
                 else "<p>No quality results recorded.</p>")
    parts.append("<h2>Golden error heat maps</h2>")
    parts += heatmaps or ["<p>No failure images (every quality check passed, or none ran).</p>"]
    parts.append("<h2>Measurements</h2>")
    parts.append(_table(["name", "backend", "median ms", "CV", "n", "mechanism", "arch"], measurement_rows)
                 if measurement_rows else "<p>No measurements recorded.</p>")
    parts.append("</body></html>")
    return ReportPage("\n".join(parts), notes)


def render_report(root: Path) -> str:
    """The whole HTML page for ledger folder ``root``."""
    return build_report(root).html
