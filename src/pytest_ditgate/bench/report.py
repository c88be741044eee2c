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
    from pytest_ditgate.bench.comparison import timer_label

    return {"kind": "comparison", "test": test, "name": f"{c.a.name} / {c.b.name}", "ratio": c.ratio,
            "ci_low": c.ci_low, "ci_high": c.ci_high, "confidence": c.confidence, "method": c.method,
            "mechanism": timer_label(c.a.mechanism), "arch": c.a.arch, "reference_median_ms": c.b.median_ms,
            "min_speedup": min_speedup, "passed": passed,
            "idle": c.idle_text().lstrip("; "), "disagreement": c.disagreement(min_speedup),
            "checks": c.check_text()}


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
            need = (", judged by the lane (min_speedup=None: no bound in this run)" if r.get("min_speedup") is None
                    else f", needs <= {1 - r['min_speedup']:.4f}")
            lines.append(f"{r['test'].rsplit('::', 1)[-1]}: {r['name']} ratio {r['ratio']:.4f}, {pct}% CI "
                         f"[{r['ci_low']:.4f}, {r['ci_high']:.4f}] ({r['method']}, {r['mechanism']}, {r['arch']})"
                         f"{need}{verdict}" + (f"; {r['idle']}" if r.get("idle") else "")
                         + (f"; {r['checks']}" if r.get("checks") else ""))
            if r.get("disagreement"):
                lines.append(f"  {r['disagreement']}")
    profiles = profile_lines(rows)
    if profiles:
        if lines:
            lines.append("")
        lines += profiles
    return lines


def profile_row(test: str, profile: dict[str, Any]) -> dict[str, Any]:
    """A summary row for one phase profile (``PhaseProfile.to_dict()``)."""
    return dict(profile, kind="profile", test=test)


TOP_IN_SUMMARY = 3


def _short(name: str, width: int = 64) -> str:
    name = name[5:] if name.startswith("void ") else name
    return name if len(name) <= width else name[:width - 3] + "..."


def _with_unit(ms: float) -> str:
    return f"{ms:.4f} ms" if ms >= 0.01 else f"{ms * 1000:.2f} us"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _against(text: str, fraction: Any, what: str) -> str:
    return text + (f" ({fraction:.0%} of {what})" if _number(fraction) else "")


def kernel_rate(kernel: dict[str, Any]) -> str:
    """The rate a top-kernel entry is judged by: ``612 TFLOP/s (77% of bf16 peak)`` for a compute kernel,
    ``3100 GB/s (73% of copy peak)`` or ``GB/s unknown: <why>`` for a memory-bound one; "" when none."""
    from pytest_ditgate.bench.profiling import MEMORY_PHASES

    memory = kernel.get("bound") == "memory"
    parts = []
    if _number(kernel.get("tflops")) and kernel.get("phase") not in MEMORY_PHASES:
        what = f"{kernel['dtype']} peak" if kernel.get("dtype") else "peak"
        parts.append(_against(f"{kernel['tflops']:.3g} TFLOP/s", kernel.get("tflops_fraction"), what))
    if memory and _number(kernel.get("gbps")):
        parts.append(_against(f"{kernel['gbps']:.4g} GB/s", kernel.get("gbps_fraction"), "copy peak"))
    elif memory:
        parts.append(f"GB/s unknown: {kernel.get('bytes_unknown') or 'bytes not known'}")
    return ", ".join(parts)


def idle_line(profile: dict[str, Any]) -> str | None:
    """Idle against both spans, saying which is which; None without phases."""
    idle = (profile.get("phases") or {}).get("idle")
    if not idle:
        return None
    text = f"idle: {idle['share']:.1%} of the traced span ({_with_unit(profile['span_ms'])})"
    timed = profile.get("timed_idle") or {}
    if timed.get("share") is not None:
        text += (f"; {timed['share']:.1%} of the timed median ({_with_unit(profile['timed_ms'])}), "
                 f"max(0, timed - busy {_with_unit(profile['busy_ms'])}) / timed")
    return text


def profile_name(test: str, profile: dict[str, Any]) -> str:
    """How a profile is named in the terminal and the HTML report: the test's name, then ``[label]``."""
    name = str(test).rsplit("::", 1)[-1]
    label = profile.get("label")
    return f"{name}[{label}]" if label and str(label) != name else name


#: a phase rate is printed only when the kernels it is computed over take at least this share of the phase
MIN_RATE_COVERAGE = 0.5


def rate_withheld(summary: dict[str, Any]) -> bool:
    """Whether a phase summary's rate is computed over too little of the phase to be shown (a CUDA graph
    replay records no launching ops, so its kernels carry no FLOPs or bytes). Every report asks this."""
    coverage = summary.get("coverage")
    return coverage is not None and coverage < MIN_RATE_COVERAGE


def _too_few(summary: dict[str, Any], title: str, time: str, amount: str) -> str | None:
    """The line that replaces a withheld phase rate; None when the rate stands."""
    if not rate_withheld(summary):
        return None
    return (f"    {title}: {amount} known for only {summary['coverage']:.0%} of {time}; no rate for the phase "
            f"(the top kernels' own rates stand)")


def profile_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Per profile: one row of phase shares (a table), then its top kernels, trace file and notes."""
    from pytest_ditgate.bench.phases import LABELS, PHASES

    profiles = [r for r in rows if r.get("kind") == "profile"]
    if not profiles:
        return []
    header = (("phase profile", "source", "traced ms") + tuple(LABELS[p] for p in PHASES if p != "idle")
              + ("idle/traced", "timed ms", "idle/timed"))
    table = [header]
    details: list[list[str]] = []
    shared = set.intersection(*(set(r.get("notes") or []) for r in profiles)) if len(profiles) > 1 else set()
    for r in profiles:
        name = profile_name(r["test"], r)
        phases = r.get("phases") or {}
        timed = r.get("timed_idle") or {}
        table.append((name, r.get("source", "?"), _ms(r["span_ms"]) if r.get("phases") else "-")
                     + tuple(f"{phases[p]['share']:.1%}" if p in phases else "-" for p in PHASES)
                     + (_ms(r["timed_ms"]) if r.get("timed_ms") else "-",
                        f"{timed['share']:.1%}" if timed.get("share") is not None else "-"))
        lines = [f"    {_short(k['name'])}: {_with_unit(k['ms'])} x{k['count']} {LABELS.get(k['phase'], k['phase'])}"
                 + (f", {rate}" if (rate := kernel_rate(k)) else "") for k in (r.get("kernels") or [])[:TOP_IN_SUMMARY]]
        gemm = r.get("gemm") or {}
        if gemm.get("tflops") is not None:
            peak = f", {gemm['peak_fraction']:.0%} of the {gemm['dtype']} peak" if gemm.get("peak_fraction") else ""
            lines.append(_too_few(gemm, "GEMM", "GEMM time", "FLOPs")
                         or f"    GEMM: {gemm['tflops']:.3g} TFLOP/s over {gemm['coverage']:.0%} of GEMM time with "
                            f"known FLOPs{peak}")
        memory = r.get("memory") or {}
        kinds = "norm/elementwise + memcpy/memset"
        if memory.get("gbps") is not None:
            peak = f", {memory['peak_fraction']:.0%} of the copy peak" if memory.get("peak_fraction") else ""
            lines.append(_too_few(memory, "memory-bound", f"{kinds} time", "bytes")
                         or f"    memory-bound: {memory['gbps']:.4g} GB/s over {memory['coverage']:.0%} of "
                            f"{kinds} time with known bytes{peak}")
        if (idle := idle_line(r)) is not None:
            lines.append(f"    {idle}")
        if r.get("trace"):
            lines.append(f"    trace: {r['trace']}")
        lines += [f"    note: {note}" for note in r.get("notes") or [] if note not in shared]
        details.append(lines)
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    out = []
    for number, row in enumerate(table):
        out.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
        if number == 0:
            out.append("  ".join("-" * w for w in widths))
    for row, lines in zip(table[1:], details):
        out += [f"  {row[0]}:"] + lines
    out += [f"note (every profile): {note}" for note in profiles[0].get("notes") or [] if note in shared]
    return out
