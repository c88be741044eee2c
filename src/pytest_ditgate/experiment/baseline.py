"""The writes of ``ditgate baseline``, once per lane: refused when the lane has a baseline, committed in full
(its genesis in the lock, the commit, the lane's history and first best), or undone (``transaction.py``)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_ditgate import git
from pytest_ditgate.experiment import history
from pytest_ditgate.experiment.record import Facts
from pytest_ditgate.experiment.transaction import TreeSnapshot
from pytest_ditgate.verdict.outcome import Verdict

if TYPE_CHECKING:
    from pytest_ditgate.golden.fixed_paths import LockSettings


@dataclass
class BaselineTransaction:
    """What a baseline of one lane writes into the project and its artefact folder, and how it is put back."""

    root: Path
    lock: LockSettings
    artefacts: Path
    lane: str

    @property
    def store(self) -> Path:
        """The golden store the lane's tests freeze into (the judge reads the project's ``golden/``)."""
        return self.root / "golden"

    @property
    def history_file(self) -> Path:
        return history.history_path(self.artefacts, self.lane)

    def recorded(self) -> bool:
        """Whether the lane has a baseline already (the lock or the lane's git ref names it)."""
        from pytest_ditgate.golden.fixed_paths import read_lock

        lanes = read_lock(self.lock).get("lanes") or {}
        return self.lane in lanes or git.read_blob_ref(self.root, history.ref_name(self.lane)) is not None

    def problems(self) -> list[str]:
        """Why the baseline may not write its lock (empty when it may): a file at the lock's path that is not a
        lock is never overwritten (``fixed_paths.overwrite_problem``)."""
        from pytest_ditgate.golden.fixed_paths import overwrite_problem

        problem = overwrite_problem(self.lock)
        return [problem] if problem else []

    def refuse_second(self) -> int:
        print(f"ditgate: lane {self.lane!r} already has a baseline (a baseline is recorded once; "
              "declare a new lane for a new one)", file=sys.stderr)
        return 2

    def snapshot(self) -> TreeSnapshot:
        """The state a failed baseline returns to, taken before anything is written."""
        return TreeSnapshot.take(self.root, rewritten=[self.lock.lock_path, self.store / "manifest.json"],
                                 store=self.store, history=self.history_file, ref=history.ref_name(self.lane))

    def undo(self, snapshot: TreeSnapshot, why: str) -> None:
        """Put the tree back as the snapshot found it, saying why and what could not be put back."""
        problems = snapshot.restore()
        if snapshot.ref is not None:  # the lane had no history before: nor has it a best to pin
            git.git(self.root, "update-ref", "-d", history.best_ref_name(self.lane), check=False)
        print(f"ditgate: baseline of lane {self.lane!r} not recorded ({why}); the tree is as it was before "
              "(no goldens, lock change, commit or history kept)" if not problems else
              f"ditgate: baseline of lane {self.lane!r} not recorded ({why}); could NOT restore: "
              + "; ".join(problems), file=sys.stderr)
        for note in snapshot.notes:
            print(f"ditgate: {note}", file=sys.stderr)

    def refuse_ignored(self) -> None:
        """The goldens, their manifest and the lock must go into the baseline commit: a file of them that git
        ignores (a ``*.safetensors`` line in ``.gitignore``) would be left out silently, and a clone would hold
        a manifest naming goldens it lacks. Raises ``GitError`` naming them (the baseline is undone)."""
        root = Path(self.root).resolve()
        paths = [str(p.resolve().relative_to(root)) for p in (self.store, self.lock.lock_path)
                 if p.resolve().is_relative_to(root)]
        hidden = [path for path in git.ignored(self.root, paths) if not path.endswith(".lock")]
        if hidden:
            raise git.GitError(f"git ignores {', '.join(hidden[:5])}{' and more' if len(hidden) > 5 else ''}: the "
                               "baseline commit would leave them out (a clone would hold a manifest naming goldens "
                               "it lacks); un-ignore the golden store and the lock in .gitignore (filelock's "
                               "*.lock files may stay ignored)")

    def commit(self, parent: str | None, facts: Facts, verdict: Verdict, detail: dict[str, Any],
               row: dict[str, Any], lock_changes: list[str]) -> dict[str, Any]:
        """Seal the genesis (what every later run must show) into the lock, commit the tree, and start the
        lane's history with the anchor and the first best, which is returned. ``detail`` and ``row`` get the
        commit."""
        from pytest_ditgate.golden.fixed_paths import write_lock

        expected = {"outputs": facts.outputs_seen,
                    "comparisons": sorted(c["name"] for c in facts.comparisons if not c["versus_best"]),
                    "reference_medians": {c["name"]: c["reference_median_ms"] for c in facts.comparisons}}
        genesis = history.seal(self.lane, {"kind": "genesis", "parent": parent, "time_utc": detail["time_utc"],
                                           "expected": expected, "lock_changes": lock_changes}, None)
        write_lock(self.lock, lanes={self.lane: {"genesis": genesis["hash"]}})
        self.refuse_ignored()
        anchor = git.commit_all(self.root, f"ditgate baseline: lane {self.lane}")
        detail["commit"] = row["commit"] = git.short(anchor)
        path = self.history_file
        history.pin_best(self.root, self.lane, anchor)
        history.append(self.root, path, genesis)
        best = {"objective": {k: verdict.objective[k] for k in ("ratio", "ci_low", "ci_high", "metric")},
                "commit": anchor, "time_utc": detail["time_utc"], "candidate_config": facts.candidate_config,
                "comparisons": facts.comparisons}
        history.append(self.root, path, history.seal(self.lane, {"kind": "anchor", "anchor": anchor,
                                                                 "best": best}, genesis))
        return best
