"""The ditbench fixture on the CPU (wall mechanism): ledger, summary, gates, refusals, xdist, pytest-benchmark.

Every run goes through ``runpytest_subprocess``: in-process pytester runs of this file crashed CPython 3.11.7
here (segfault in the garbage collector while rendering an inner failure, after an earlier in-process run);
the same runs repeated with ``pytest.main`` in one process did not crash.
"""

from __future__ import annotations

import json

import pytest

from pytest_ditgate.fsutil import read_jsonl

from host_only import no_cuda  # noqa: F401 - a fixture: the suites below time host code, as on a CPU machine

FAST_BUDGET = "--ditgate-bench-budget-ms=15"

SUITE = """
def work(n):
    return sum(range(n))

def test_one(ditbench):
    m = ditbench(work, 2000, label="sum2k", backend="python")
    assert m.mechanism == "wall" and m.n >= 10 and m.arch == "cpu"
    assert "no CUDA device" in m.mechanism_notes["latency"]
"""


def _ledger(pytester: pytest.Pytester) -> list[dict]:
    records, bad = read_jsonl(pytester.path / ".ditgate" / "bench.jsonl")
    assert bad == []
    return records


@pytest.mark.usefixtures("no_cuda")
def test_measures_records_summarises_and_feeds_pytest_benchmark(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(SUITE)
    result = pytester.runpytest_subprocess("--ditgate", FAST_BUDGET, "--benchmark-json=bench.json")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*= ditgate benchmarks =*", "name*backend*median ms*CV*n*mechanism*arch",
                                 "test_one[[]sum2k[]]*python*wall/spaced*cpu", "ledger: *bench.jsonl"])
    text = result.stdout.str()  # pytest-benchmark's table of the same samples first, ours next to the outcome
    assert text.index("benchmark 'ditgate'") < text.index("= ditgate benchmarks =")
    (record,) = _ledger(pytester)
    assert record["kind"] == "measurement" and record["test"].endswith("::test_one")
    ours = record["measurement"]
    assert (ours["label"], ours["backend"], ours["mechanism"], ours["arch"]) == ("sum2k", "python", "wall", "cpu")
    assert len(ours["samples_ms"]) == ours["n"] and ours["median_ms"] > 0
    # pytest-benchmark's JSON (and so its storage and compare) holds our device-time samples and provenance
    (entry,) = json.loads((pytester.path / "bench.json").read_text())["benchmarks"]
    assert entry["options"]["timer"] == "ditgate.wall"
    assert entry["extra_info"]["ditgate_mechanism"] == "wall" and entry["extra_info"]["ditgate_arch"] == "cpu"
    assert entry["extra_info"]["ditgate_label"] == "sum2k" and entry["extra_info"]["ditgate_backend"] == "python"
    assert entry["stats"]["data"] == pytest.approx([s / 1e3 for s in ours["samples_ms"]])
    assert entry["stats"]["median"] == pytest.approx(ours["median_ms"] / 1e3)


def test_skipped_when_gates_are_off(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(SUITE)
    pytester.runpytest_subprocess("-p", "no:benchmark").assert_outcomes(skipped=1)


PAIR = """
import pytest
from pytest_ditgate import GateFailure

def slow():
    return sum(range(40000))

def fast():
    return sum(range(4000))

def test_faster(ditbench):
    c = ditbench.pair(fast, slow, min_speedup=0.5)
    assert c.ratio < 0.5 and c.method == "paired-bootstrap"

def test_claim_fails(ditbench):
    ditbench.pair(slow, fast, min_speedup=0.05)
"""


@pytest.mark.usefixtures("no_cuda")
def test_pair_passes_a_real_speedup_and_fails_a_false_claim(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(PAIR)
    result = pytester.runpytest_subprocess("--ditgate", FAST_BUDGET, "-p", "no:benchmark")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*[[]too_slow[]] candidate is not faster than the reference by at least 5.0%*",
        "test_faster: candidate / reference ratio 0.*95% CI [[]*[]] (paired-bootstrap, wall, cpu), needs <= 0.5000 PASS; "
        "outputs are not tensors: not compared",
        "test_claim_fails: candidate / reference ratio *, needs <= 0.9500 FAIL; outputs are not tensors: not compared",
    ])
    comparisons = [r for r in _ledger(pytester) if r["kind"] == "comparison"]
    assert sorted(r["passed"] for r in comparisons) == [False, True]
    assert all(r["ci_low"] <= r["ratio"] <= r["ci_high"] for r in comparisons)


@pytest.mark.usefixtures("no_cuda")
def test_refusals_failed_kernel_check_patched_clock_and_no_gpu(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("""
        import pytest
        from pytest_ditgate.correctness.plugin import kernel_checks_key

        @pytest.fixture
        def failed_check(request):
            request.node.stash.setdefault(kernel_checks_key, []).append(("my_kernel", False, "mismatch"))
    """)
    pytester.makepyfile("""
        import time
        import pytest
        from pytest_ditgate.errors import DitgateUsageError

        def test_after_failed_check(failed_check, ditbench):
            ditbench(sum, range(10))

        def test_patched_clock(ditbench, monkeypatch):
            monkeypatch.setattr(time, "perf_counter", lambda: 0.0)
            ditbench(sum, range(10))

        def test_cupti_on_cpu(ditbench):
            with pytest.raises(DitgateUsageError, match="cupti: not available: no CUDA device"):
                ditbench(sum, range(10), mechanism="cupti")
    """)
    result = pytester.runpytest_subprocess("--ditgate", FAST_BUDGET, "-p", "no:benchmark")
    result.assert_outcomes(failed=2, passed=1)
    result.stdout.fnmatch_lines_random([
        "*[[]unchecked[]] refusing to time: kernel_check failed earlier in this test: my_kernel (mismatch)*",
        "*[[]timer_tampered[]]*time.perf_counter*",
    ])
    assert not (pytester.path / ".ditgate" / "bench.jsonl").exists()


@pytest.mark.slow  # xdist workers each import torch
def test_ledger_and_summary_under_xdist(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    body = ["def work(n):\n    return sum(range(n))\n"]
    for i in range(8):
        body.append(f"def test_{i}(ditbench):\n" + "".join(
            f"    ditbench(work, 500, label='w{i}_{j}', reps=20, warmup=1)\n" for j in range(3)))
    pytester.makepyfile("\n".join(body))
    result = pytester.runpytest_subprocess("--ditgate", "-n", "2", "-p", "no:benchmark", "-p", "no:randomly")
    result.assert_outcomes(passed=8)
    records = _ledger(pytester)
    labels = sorted(r["measurement"]["label"] for r in records)
    assert labels == sorted(f"w{i}_{j}" for i in range(8) for j in range(3))
    assert {r["worker"] for r in records} == {"gw0", "gw1"}  # both workers wrote to the one ledger
    summary = result.stdout.str().split("ditgate benchmarks", 1)[1]
    assert all(f"[w{i}_{j}]" in summary for i in range(8) for j in range(3))
