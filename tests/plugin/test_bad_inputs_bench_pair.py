"""``ditbench.pair`` results reach ``--benchmark-json`` and ``ditgate report``, and a ledger with a torn last
line loses neither the old records nor the new one. A subprocess run (in-process runs of ditbench crashed
CPython here, see test_bench_fixture.py)."""

from __future__ import annotations

import json

import pytest

from pytest_ditgate import cli
from pytest_ditgate.fsutil import read_jsonl_report

PAIR = """
def slow():
    return sum(range(20000))

def fast():
    return sum(range(2000))

def test_pair(ditbench):
    ditbench.pair(fast, slow, min_speedup=0.5)
"""


def test_pair_reaches_benchmark_json_and_the_report(pytester: pytest.Pytester, capsys) -> None:
    pytest.importorskip("pytest_benchmark")
    ledger = pytester.path / ".ditgate" / "bench.jsonl"
    ledger.parent.mkdir()
    ledger.write_text('{"kind": "measurement", "measurement": {"label": "old"}}\n{"kind": "compa')  # torn
    pytester.makepyfile(PAIR)
    result = pytester.runpytest_subprocess("--ditgate", "--ditgate-bench-budget-ms=5", "--benchmark-json=b.json")
    result.assert_outcomes(passed=1)
    (entry,) = json.loads((pytester.path / "b.json").read_text())["benchmarks"]
    info = entry["extra_info"]
    assert info["ditgate_pair"] is True and info["ditgate_pair_passed"] is True
    assert info["ditgate_pair_ci_low"] <= info["ditgate_pair_ratio"] <= info["ditgate_pair_ci_high"] < 0.5
    assert info["ditgate_pair_reference"] == "reference" and entry["options"]["timer"] == "ditgate.wall"
    content = read_jsonl_report(ledger)
    assert content.bad == [2] and [r["kind"] for r in content.records] == ["measurement", "comparison"]
    assert cli.main(["report", "--dir", str(ledger.parent)]) == 0
    err = capsys.readouterr().err
    assert f"{ledger}: skipped 1 unreadable line(s) (2)" in err
    page = (ledger.parent / "report.html").read_text()
    assert "<td>test_pair</td><td>candidate / reference</td>" in page and "PASS" in page
