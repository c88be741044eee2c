"""Where a verdict goes: the ledger row and ``verdict.json`` in the artefact folder, its lines on stdout, and a
new best's advisory copy for ``--ditgate-lane`` runs."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_ditgate.fsutil import atomic_write_json
from pytest_ditgate.verdict.ledger import append_experiment, store_best
from pytest_ditgate.verdict.outcome import EXIT_CODES, Verdict

VERDICT_FILE = "verdict.json"


@dataclass
class Publisher:
    """Writes and prints the verdicts of one lane; what goes wrong here is said, never raised."""

    artefacts: Path
    lane: str

    def write(self, verdict: Verdict, detail: dict[str, Any], row: dict[str, Any]) -> int:
        try:
            append_experiment(self.artefacts, row, detail)
            atomic_write_json(self.artefacts / VERDICT_FILE, detail)
        except OSError as exc:
            print(f"ditgate: could not write the ledger under {self.artefacts}: {exc}", file=sys.stderr)
            return EXIT_CODES["crash"]
        return self.report(verdict, detail.get("quality"))

    def report(self, verdict: Verdict, quality: list[dict[str, Any]] | None = None) -> int:
        print("\n".join(verdict.lines()))
        for note in sorted({q["judged_on"] for q in quality or () if q.get("judged_on")}):
            print(f"note: {note}")
        print(f"verdict: {self.artefacts / VERDICT_FILE}")
        return verdict.exit_code

    def mirror_best(self, best: dict[str, Any] | None, arch: str | None) -> None:
        """Copy a new best to ``<artefacts>/best/`` for advisory ``--ditgate-lane`` runs (best effort; the
        judge itself only ever reads the lane's history)."""

        if best is None or arch is None:
            return
        try:
            store_best(self.artefacts, self.lane, arch, best)
        except OSError as exc:
            print(f"ditgate: could not mirror the lane best under {self.artefacts}: {exc}", file=sys.stderr)
