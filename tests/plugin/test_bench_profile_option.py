"""``--ditgate-profile`` / ``ditbench(..., profile=True)`` end to end on the CPU: a traced run after the
timing, the phase table in the terminal summary, the profiles in the ledger, the Chrome trace on disk,
and the phase section of ``ditgate report``. (On a CPU the phases are host ops; docs/profiling.md.)"""

from __future__ import annotations

import json

import pytest

from pytest_ditgate import cli
from pytest_ditgate.bench.fixture import DitBench
from pytest_ditgate.bench.timers import Call
from pytest_ditgate.fsutil import read_jsonl

from host_only import no_cuda  # noqa: F401 - a fixture: hides a GPU host's device

SUITE = """
import torch

w = torch.randn(128, 256)

def mlp(x, scale=1.0):
    return torch.nn.functional.gelu(x @ w) * scale

def test_traced(ditbench):
    ditbench(mlp, torch.randn(64, 128), scale=2.0, label="mlp", reps=5, warmup=1)

def test_opted_out(ditbench):
    ditbench(mlp, torch.randn(64, 128), label="quiet", profile=False, reps=5, warmup=1)

def test_pure_python(ditbench):
    ditbench(lambda n: sum(range(n)), 1000, label="py", reps=5, warmup=1)

def test_pair(ditbench):
    x = torch.randn(64, 128)
    ditbench.pair(lambda x: x @ w, mlp, x, min_speedup=None, rounds=10, warmup=1, verify=False)  # not the same op
"""


@pytest.mark.usefixtures("no_cuda")  # the CPU run's phases and notes
def test_profile_option_traces_summarises_records_and_reports(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(SUITE)
    result = pytester.runpytest_subprocess("--ditgate", "--ditgate-profile", "-p", "no:benchmark",
                                           "-p", "no:randomly", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines([
        "phase profile*source*traced ms*GEMM*attention*norm/elementwise*memcpy/memset*other*idle/traced*"
        "timed ms*idle/timed",
        "test_traced[[]mlp[]]*host*%*%*%*%*%*%*%",
        "test_pure_python[[]py[]]*none*-*",
        "test_pair[[]candidate[]]*host*", "test_pair[[]reference[]]*host*",
        "  test_traced[[]mlp[]]:", "    idle: *% of the traced span (*); *% of the timed median (*), "
        "max(0, timed - busy *) / timed",
        "    trace: profiles/*.json", "    note: CPU run: no peaks, rates are absolute",
        "phase profiles: Chrome/Perfetto traces under *profiles/*",
    ])
    assert "quiet" not in result.stdout.str().split("phase profile", 1)[1]
    records = {(r["kind"], (r.get("measurement") or {}).get("label")): r
               for r in read_jsonl(pytester.path / ".ditgate" / "bench.jsonl")[0]}
    (traced,) = records[("measurement", "mlp")]["profiles"]
    assert traced["source"] == "host" and traced["label"] == "mlp" and traced["arch"] == "cpu"
    assert traced["phases"]["gemm"]["ms"] > 0 and traced["phases"]["elementwise"]["ms"] > 0
    kernels = {k["name"]: k for k in traced["kernels"]}
    assert kernels["aten::mm"]["flops"] == 2 * 64 * 128 * 256 and kernels["aten::mm"]["bound"] == "compute"
    # gelu is judged by the bytes its op's recorded shapes move (read x, write y), not by FLOPs
    gelu = kernels["aten::gelu"]
    assert gelu["bound"] == "memory" and gelu["bytes"] == 2 * 64 * 256 * 4 and gelu["gbps"] > 0
    text = result.stdout.str()
    assert "TFLOP/s" not in "".join(line for line in text.splitlines() if "aten::gelu:" in line)
    # idle against the untraced median: max(0, timed - busy) / timed
    timed = records[("measurement", "mlp")]["measurement"]["median_ms"]
    assert traced["timed_ms"] == timed
    assert traced["timed_idle"]["share"] == pytest.approx(max(0.0, timed - traced["busy_ms"]) / timed)
    assert "CPU run: no peaks, rates are absolute" in traced["notes"]
    text = (pytester.path / ".ditgate" / traced["trace"]).read_text()
    trace = json.loads(text)
    assert trace["traceName"] == traced["trace"].rsplit("/", 1)[-1] and str(pytester.path) not in text
    assert any(e.get("name") == "ditgate::profile" for e in trace["traceEvents"])
    assert "profiles" not in records[("measurement", "quiet")]
    (python,) = records[("measurement", "py")]["profiles"]
    assert python["source"] == "none" and "nothing to split" in " ".join(python["notes"])
    pair = records[("comparison", None)]["profiles"]
    assert [p["label"] for p in pair] == ["candidate", "reference"]
    assert pair[1]["phases"]["elementwise"]["ms"] > 0  # the reference's gelu and scale
    # the report renders them
    assert cli.main(["report", "--dir", str(pytester.path / ".ditgate")]) == 0
    page = (pytester.path / ".ditgate" / "report.html").read_text()
    assert "<h2>Phase profiles</h2>" in page and "4 phase profiles" in page and "aten::mm" in page


def test_profile_flag_needs_the_gates(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest("--ditgate-profile", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--ditgate-profile needs --ditgate*"])


def test_ditbench_profiles_per_call_with_the_function_arguments_only() -> None:
    seen: list[tuple[Call, str, float]] = []
    recorded: list[list] = []

    def profiler(call: Call, label: str, timed_ms: float, eager: Call | None) -> dict:
        assert eager is None  # no profile_eager= given
        seen.append((call, label, timed_ms))
        return {"label": label, "source": "none"}

    bench = DitBench(test="t.py::test_x", lane="default", record_measurement=lambda m, p: recorded.append(p),
                     record_comparison=lambda c, s, ok, p: recorded.append(p), checks=lambda: [], profiler=profiler,
                     defaults={"mechanism": "wall", "l2": "warm"})

    def work(n, step=1):
        return sum(range(0, n, step))

    bench(work, 100, step=2, reps=3, warmup=1)  # profiling off by default
    m = bench(work, 100, step=2, reps=3, warmup=1, label="on", profile=True)
    assert recorded[0] == [] and recorded[1] == [{"label": "on", "source": "none"}]
    (call, label, timed), = seen
    assert (call.args, call.kwargs, label) == ((100,), {"step": 2}, "on")  # no measure knobs leak into the call
    assert timed == m.median_ms  # the untraced median goes along, to read idle against
    bench.profile = True  # --ditgate-profile
    c = bench.pair(work, work, 100, step=3, rounds=10, warmup=1, min_speedup=None)
    assert [(label, timed) for _, label, timed in seen[1:]] == [("candidate", c.a.median_ms),
                                                                ("reference", c.b.median_ms)]
    assert all(c.kwargs == {"step": 3} for c, _, _ in seen[1:]) and len(recorded[2]) == 2
