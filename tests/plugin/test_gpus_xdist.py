"""Scale-out: each xdist worker pinned to its own GPU; timed regions never overlap on one GPU."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("xdist")

PROBE = """
import json, os, time
import pytest
from pytest_ditgate.gpus import exclusive_gpu

@pytest.mark.parametrize("n", range(4))
def test_record(n, worker_id):
    with exclusive_gpu():
        start = time.time()
        time.sleep(0.3)
        end = time.time()
    with open(f"rec-{worker_id}-{n}.json", "w") as f:
        json.dump({"worker": worker_id, "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                   "start": start, "end": end}, f)
"""


def _records(path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(path.glob("rec-*.json"))]


def test_one_worker_per_gpu(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    pytester.makepyfile(PROBE)
    result = pytester.runpytest("--ditgate", "-n", "2")
    result.assert_outcomes(passed=4)
    by_worker = {r["worker"]: r["visible"] for r in _records(pytester.path)}
    assert by_worker == {"gw0": "3", "gw1": "5"}
    result.stdout.fnmatch_lines(["*ditgate GPUs per worker*", "gw0: CUDA_VISIBLE_DEVICES=3*",
                                 "gw1: CUDA_VISIBLE_DEVICES=5*"])


def test_shared_gpu_timing_never_overlaps(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    pytester.makepyfile(PROBE)
    result = pytester.runpytest("--ditgate", "-n", "2")
    result.assert_outcomes(passed=4)
    records = sorted(_records(pytester.path), key=lambda r: r["start"])
    assert {r["visible"] for r in records} == {"0"}
    assert len({r["worker"] for r in records}) == 2
    for earlier, later in zip(records, records[1:]):
        assert later["start"] >= earlier["end"] - 1e-3, "two timed regions overlapped on one GPU"


def test_no_pinning_without_gates(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    pytester.makepyfile(PROBE)
    pytester.runpytest("-n", "2", "-p", "xdist").assert_outcomes(passed=4)
    assert {r["visible"] for r in _records(pytester.path)} == {"3,5"}


def test_assign_round_robin() -> None:
    from pytest_ditgate.gpus import assign_gpu

    assert [assign_gpu(f"gw{i}", ["0", "1"]) for i in range(4)] == ["0", "1", "0", "1"]
    assert assign_gpu("gw0", []) is None
