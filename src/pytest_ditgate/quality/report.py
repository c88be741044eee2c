"""The four-way baseline -> candidate transition table of a run: lines for the terminal and a JSON summary.

Builds text and data only; printing and writing are the plugin's job. Baseline status is judged against
the contract's absolute floors; candidate status is the full gate. ``pass->fail`` rejects the candidate.
"""

from __future__ import annotations

from typing import Any

TRANSITIONS = ("pass->pass", "pass->fail", "fail->pass", "fail->fail")
MEANING = {"pass->pass": "kept", "pass->fail": "REJECTS the candidate", "fail->pass": "fixed",
           "fail->fail": "failed at baseline too"}


def counts(records: list[dict[str, Any]]) -> dict[str, int]:
    out = {name: 0 for name in TRANSITIONS}
    for record in records:
        out[record["transition"]] = out.get(record["transition"], 0) + 1
    return out


def table_lines(records: list[dict[str, Any]]) -> list[str]:
    """The count per transition, then one line per case that did not stay ``pass->pass``."""
    total = counts(records)
    width = max(len(name) for name in TRANSITIONS)
    lines = [f"{'baseline->candidate':<{width + 2}} cases"]
    lines += [f"{name:<{width + 2}} {total[name]:>5}  {MEANING[name]}" for name in TRANSITIONS]
    for record in sorted(records, key=lambda r: (TRANSITIONS.index(r["transition"]), r["nodeid"], r["case"])):
        if record["transition"] == "pass->pass" and record["passed"]:
            continue
        verdict = "passed" if record["passed"] else "FAILED"
        first = (record["failures"] or record.get("notes") or [""])[0]
        lines.append(f"  {record['transition']:<{width}} {record['nodeid']} [{record['case']}] "
                     f"{record['experiment_class']}/{record['dtype']} {verdict}: {first}")
        lines += [f"      image: {path}" for path in record.get("images", [])[:3]]
    return lines + skipped_lines(records) + structural_lines(records)


def structural_lines(records: list[dict[str, Any]]) -> list[str]:
    """Each case no metric judged (the contract's ``[structural]`` table), once: what it was judged on."""
    seen = sorted({(record["case"], record["structural"]) for record in records if record.get("structural")})
    return [f"{case}: {why}" for case, why in seen]


def skipped_lines(records: list[dict[str, Any]]) -> list[str]:
    """Each distinct reason a metric was skipped, once, with how many cases it hit."""
    seen: dict[tuple[str, str], int] = {}
    for record in records:
        for name, why in record.get("skipped", {}).items():
            if not why.startswith("not applicable"):
                metric = name.rsplit(".", 1)[-1]
                seen[(metric, why)] = seen.get((metric, why), 0) + 1
    return [f"skipped {metric} in {count} case(s): {why}" for (metric, why), count in sorted(seen.items())]


def summary_json(records: list[dict[str, Any]]) -> dict[str, Any]:
    return {"counts": counts(records), "rejected": any(r["transition"] == "pass->fail" for r in records),
            "cases": sorted(records, key=lambda r: (r["nodeid"], r["case"]))}
