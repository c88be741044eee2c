"""Summary rows for the terminal: built from measurements and comparisons, printed by the plugin.

Rows are plain dicts so that they ride on test reports across pytest-xdist to the controller.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_ditgate.bench.comparison import Comparison
    from pytest_ditgate.bench.measurement import Measurement



def measurement_row(test: str, m: Measurement) -> dict[str, Any]:
    return {"kind": "measurement", "test": test, "name": m.name, "backend": m.backend, "median_ms": m.median_ms,
            "cv": m.cv, "n": m.n, "mechanism": m.mechanism, "regime": m.regime, "l2": m.l2_mode, "arch": m.arch}


def comparison_row(test: str, c: Comparison, min_speedup: float | None, passed: bool | None) -> dict[str, Any]:
    return {"kind": "comparison", "test": test, "name": f"{c.a.name} / {c.b.name}", "ratio": c.ratio,
            "ci_low": c.ci_low, "ci_high": c.ci_high, "confidence": c.confidence, "method": c.method,
            "mechanism": c.a.mechanism, "arch": c.a.arch, "min_speedup": min_speedup, "passed": passed}


def _ms(value: float) -> str:
    return f"{value:.4f}" if value >= 0.01 else f"{value * 1000:.2f}us"


def summary_lines(rows: list[dict[str, Any]]) -> list[str]:
    """A table of measurements and one line per comparison with its CI bound; empty without rows."""
    measurements = [r for r in rows if r.get("kind") == "measurement"]
    comparisons = [r for r in rows if r.get("kind") == "comparison"]
    lines: list[str] = []
    if measurements:
        header = ("name", "backend", "median ms", "CV", "n", "mechanism", "arch")
        table = [header] + [(f"{r['test'].rsplit('::', 1)[-1]}[{r['name']}]" if r["name"] not in r["test"]
                             else r["test"].rsplit("::", 1)[-1], str(r.get("backend") or "-"), _ms(r["median_ms"]),
                             f"{r['cv']:.2%}", str(r["n"]),
                             f"{r['mechanism']}/{r['regime']}" + ("/cold" if r.get("l2") == "cold" else ""),
                             r["arch"]) for r in measurements]
        widths = [max(len(row[i]) for row in table) for i in range(len(header))]
        for number, row in enumerate(table):
            lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
            if number == 0:
                lines.append("  ".join("-" * w for w in widths))
    if comparisons:
        if lines:
            lines.append("")
        for r in comparisons:
            pct = int(round(r["confidence"] * 100))
            verdict = "" if r.get("passed") is None else (" PASS" if r["passed"] else " FAIL")
            need = "" if r.get("min_speedup") is None else f", needs <= {1 - r['min_speedup']:.4f}"
            lines.append(f"{r['test'].rsplit('::', 1)[-1]}: {r['name']} ratio {r['ratio']:.4f}, {pct}% CI "
                         f"[{r['ci_low']:.4f}, {r['ci_high']:.4f}] ({r['method']}, {r['mechanism']}, {r['arch']})"
                         f"{need}{verdict}")
    return lines
