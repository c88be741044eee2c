"""benchmarks/kernel_check_memory.py at a small size on the CPU: each case's check passes and its memory and
time are recorded (the GPU check runs it at 4096 x 128256 on CUDA)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import kernel_check_memory as bench  # noqa: E402


@pytest.mark.parametrize("case", bench.CASES)
def test_the_benchmark_measures_a_passing_check(case: str) -> None:
    result = bench.measure_case(case, 16, 2048, "cpu", trials=1)
    assert result["passed"] and result["trials"] == 1 and result["extremal_trials"] == 3
    assert result["inputs_bytes"] == 16 * 2048 * 2 + 16 * 8 and result["seconds"] > 0
    assert result["check_memory"]["inputs_bytes"] == result["inputs_bytes"]
    assert result["host_peak_reset"] is False or result["host_peak_delta_bytes"] >= 0
    assert "| " + case + " | True |" in bench.table([result])
