"""scripts/agent_loop_empty.py (the GPU check's ``empty`` stage): twenty empty commits judged on the DiT lane must be
11 in at least 19; a run of another exit code, a failed baseline or too many KEEPs fail it, and the record says
why. The judged runs are replaced here by their exit codes (the stage runs them on a GPU)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import agent_loop_empty as empty  # noqa: E402


def fake(codes: list[int], baseline: int = 0):
    def run(work, log, runs):
        return baseline, [{"run": i + 1, "exit": code, "seconds": 1.0, "ratio": 1.0, "ci_low": 0.99, "ci_high": 1.01,
                           "vs_best": ""} for i, code in enumerate(codes[:runs])]
    return run


@pytest.mark.parametrize(("codes", "baseline", "passed"), [
    ([11] * 20, 0, True),
    ([11] * 19 + [0], 0, True),  # one noise KEEP in twenty is allowed
    ([11] * 18 + [0, 0], 0, False),
    ([11] * 19 + [15], 0, False),  # a crash is never an answer
    ([11] * 20, 12, False),
])
def test_the_stage_counts_the_discards(monkeypatch, tmp_path: Path, codes, baseline, passed) -> None:
    monkeypatch.setattr(empty, "run", fake(codes, baseline))
    out = tmp_path / "empty.json"
    assert empty.main(["--runs", "20", "--json", str(out)]) == (0 if passed else 1)
    record = json.loads(out.read_text())
    (target,) = record["targets"]
    assert target["limit"] == ">= 19" and target["pass"] is passed
    assert record["keeps"] == codes.count(0)
