"""The deciding process of ``ditgate experiment`` and ``ditgate baseline``.

Started by the CLI as ``python -B -P -c <bootstrap> <root> ...`` (``bootstrap.JUDGE``): no project
bytecode, no current folder on ``sys.path``. It checks the environment, the fixed-paths lock, the lane's
history and the scope against the lane's anchors; runs the lane's tests in ONE child pytest process that
writes outputs and timing samples to a fresh folder; judges that evidence with fixed code; and writes the
verdict, the ledger row and the history record, all from one :class:`~pytest_ditgate.verdict.Verdict`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from pytest_ditgate import git
from pytest_ditgate.artefacts import resolve_artefact_dir
from pytest_ditgate.errors import DitgateUsageError
from pytest_ditgate.experiment import child_process, history
from pytest_ditgate.experiment.assess import Assessor
from pytest_ditgate.experiment.policy import recorded_environment
from pytest_ditgate.experiment.preflight import Preflight, baseline_problems
from pytest_ditgate.experiment.record import Facts, build, history_body
from pytest_ditgate.experiment.transaction import TreeSnapshot
from pytest_ditgate.fsutil import atomic_write_json, lock_for
from pytest_ditgate.project_config import load_project_config, string_list
from pytest_ditgate.quality.specs import EXPERIMENT_CLASSES
from pytest_ditgate.verdict.ledger import append_experiment, store_best
from pytest_ditgate.verdict.outcome import EXIT_CODES, Category

#: exit status of a run that cannot start (an unknown lane, a setting, a tree that is not ready), as pytest's
EXIT_USAGE = 4
VERDICT_FILE = "verdict.json"
RUNS_DIR = "runs"


class Refused(Exception):
    """The run cannot start (unknown lane, unreadable config): a usage error, exit 4."""


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ditgate-judge")
    parser.add_argument("mode", choices=("experiment", "baseline"))
    parser.add_argument("--lane", required=True)
    parser.add_argument("--class", dest="cls", default=None)
    parser.add_argument("--description", default="")
    return parser.parse_args(argv)


#: when the judge's process imported this module (its phases are timed from here)
STARTED = time.perf_counter()


def main(argv: list[str]) -> int:
    args = parse(argv)
    root = Path.cwd()
    try:
        judge = Judge(root, args)
    except Refused as exc:
        print(f"ditgate: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return judge.baseline() if args.mode == "baseline" else judge.experiment()
    except KeyboardInterrupt:  # a baseline puts the tree back itself; an experiment records nothing unfinished
        print(f"ditgate: {args.mode} of lane {args.lane!r} interrupted", file=sys.stderr)
        return 130


class Judge:
    def __init__(self, root: Path, args: argparse.Namespace) -> None:
        from pytest_ditgate.verdict.lane import load_lane
        from pytest_ditgate.golden.fixed_paths import LockSettings

        self.root = root
        self.args = args
        try:
            self.project = load_project_config(root)
            self.lane = load_lane(self.project, args.lane)
            self.lock = LockSettings.from_rootdir(root)
            self.mutable = string_list(self.project, "mutable_paths")
        except DitgateUsageError as exc:
            raise Refused(str(exc)) from None
        declared = self.lane.default_class if args.cls is None else args.cls

        if declared not in EXPERIMENT_CLASSES:
            raise Refused(f"--class {declared!r}: choose from {', '.join(EXPERIMENT_CLASSES)}")
        self.declared = declared
        # DITGATE_DIR is refused below, so the artefact folder is the project's
        self.artefacts = resolve_artefact_dir(root, env={}, table=self.project)
        self.env = dict(os.environ)
        self.preflight = Preflight(root, self.lock, self.project, self.artefacts, self.env, self.mutable)
        self.assessor = Assessor(root, self.lane, declared, self.project, self.env)

    # -- the child ----------------------------------------------------------------------------------
    def run_child(self, out: Path, *, freeze: bool, best: dict[str, Any] | None) -> int:
        """The lane's tests in the child process, writing into ``out``; its exit code."""
        return child_process.run_child(self.root, self.lane, self.declared, self.env, out, freeze=freeze, best=best)

    # -- the two modes ------------------------------------------------------------------------------
    def experiment(self) -> int:
        from pytest_ditgate.golden.fixed_paths import read_lock

        path = history.history_path(self.artefacts, self.lane.name)
        with lock_for(path.with_suffix(".run")):  # concurrent experiments on one lane run one after the other
            self.preflight.check_environment()
            self.preflight.check_lock()
            self.preflight.check_own_modules()
            genesis = (read_lock(self.lock).get("lanes") or {}).get(self.lane.name, {}).get("genesis")
            lane_history = None
            best = None
            changed = None
            try:
                lane_history = history.read_history(self.root, self.artefacts, self.lane.name, genesis_hash=genesis)
                best = lane_history.best()
                anchor = lane_history.anchor
                if anchor is None or not git.is_ancestor(self.root, anchor):
                    raise history.HistoryError(f"the lane's baseline commit {anchor} is not an ancestor of HEAD")
                changed = self.preflight.check_scope([("baseline commit", anchor), ("best's commit", best["commit"])])
            except history.HistoryError as exc:
                self.preflight.problems.append((Category.INTEGRITY, f"lane history: {exc}"))
            if self.preflight.problems:
                return self.finish(lane_history, best, changed, None)
            if self.preflight.refuse_uncommitted():
                return EXIT_USAGE
            judged_files = self.preflight.judged_files(known=self.preflight.fixed_files)  # the lock's: hashed
            out = self.new_run_folder()
            before = time.perf_counter()
            returncode = self.run_child(out, freeze=False, best=best)
            child = time.perf_counter()
            try:
                return self.finish(lane_history, best, changed, (out, returncode), judged_files)
            finally:
                # the judge's own cost, the part an agent waits for beyond its tests (issue 14: <= 10 %)
                print(f"ditgate: judge time: {before - STARTED:.2f} s before the child, {child - before:.2f} s "
                      f"the child, {time.perf_counter() - child:.2f} s after it", flush=True)

    def baseline(self) -> int:
        """Record the lane's baseline, as one transaction: everything that can be checked first is (nothing is
        written before: exit 4 naming the problem); then the run, the lock, the commit and the history either
        all happen, or the tree is put back as it was (``transaction.py``)."""

        path = history.history_path(self.artefacts, self.lane.name)
        if self.baselined():
            return self.refuse_second_baseline()
        problems = baseline_problems(self.root, self.project, self.lane.tests, self.artefacts, path, self.store)
        if problems:
            for problem in problems:
                print(f"ditgate: cannot record a baseline: {problem}", file=sys.stderr)
            return EXIT_USAGE
        with lock_for(path.with_suffix(".run")):
            if self.baselined():  # another baseline of this lane finished while this one waited
                return self.refuse_second_baseline()
            self.preflight.check_environment()
            if self.preflight.problems:
                return self.report(self.finish_baseline_refused())
            self.preflight.check_lock()
            lock_changes = [text for _, text in self.preflight.problems]
            self.preflight.problems.clear()  # the maintainer's baseline relocks; what changed is recorded for review
            snapshot = TreeSnapshot.take(self.root, rewritten=[self.lock.lock_path, self.store / "manifest.json"],
                                         store=self.store, history=path, ref=history.ref_name(self.lane.name))
            try:
                code, committed = self.record_baseline(lock_changes)
            except BaseException as exc:
                self.undo(snapshot, f"stopped by {type(exc).__name__}" + (f": {exc}" if str(exc) else ""))
                if isinstance(exc, KeyboardInterrupt):
                    return 130
                return EXIT_CODES["crash"]
            if not committed:
                self.undo(snapshot, f"the baseline run was not green (exit code {code})")
            return code

    @property
    def store(self) -> Path:
        """The golden store the lane's tests freeze into (the judge reads the project's ``golden/``)."""
        return self.root / "golden"

    def baselined(self) -> bool:
        from pytest_ditgate.golden.fixed_paths import read_lock

        lanes = read_lock(self.lock).get("lanes") or {}
        return self.lane.name in lanes or git.read_blob_ref(self.root, history.ref_name(self.lane.name)) is not None

    def refuse_second_baseline(self) -> int:
        print(f"ditgate: lane {self.lane.name!r} already has a baseline (a baseline is recorded once; "
              "declare a new lane for a new one)", file=sys.stderr)
        return 2

    def undo(self, snapshot: Any, why: str) -> None:
        """Put the tree back as the snapshot found it, saying why and what could not be put back."""
        problems = snapshot.restore()
        print(f"ditgate: baseline of lane {self.lane.name!r} not recorded ({why}); the tree is as it was before "
              "(no goldens, lock change, commit or history kept)" if not problems else
              f"ditgate: baseline of lane {self.lane.name!r} not recorded ({why}); could NOT restore: "
              + "; ".join(problems), file=sys.stderr)
        for note in snapshot.notes:
            print(f"ditgate: {note}", file=sys.stderr)

    # -- deciding and writing -----------------------------------------------------------------------
    def new_run_folder(self) -> Path:
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
        base = self.artefacts / RUNS_DIR
        base.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f"{self.lane.name}-{stamp}-", dir=base)) / "child"

    def facts(self, best: dict[str, Any] | None, changed: list[str] | None, *, arch: str | None = None) -> Any:
        head = git.head(self.root)
        return Facts(lane=self.lane.name, declared_class=self.declared, effective_class=self.declared,
                     class_evidence=[], description=self.args.description, commit=git.short(head),
                     parent=git.short(git.rev(self.root, "HEAD^")), arch=arch or "", problems=self.preflight.problems,
                     best_before=best, changed_paths=changed, min_improvement=self.lane.min_improvement,
                     environment={"variables": recorded_environment(self.env), "python": sys.executable,
                                  "plugin": str(Path(__file__).resolve().parents[1]),
                                  "lane": {"tests": list(self.lane.tests), "class": self.lane.default_class,
                                           "required": list(self.lane.required),
                                           "min_improvement": self.lane.min_improvement}})

    def finish(self, lane_history: Any, best: dict[str, Any] | None, changed: list[str] | None,
               child: tuple[Path, int] | None, judged_files: dict[str, str] | None = None) -> int:

        facts = self.facts(best, changed, arch=child_process.machine_arch() if child is not None else None)
        if lane_history is not None:
            facts.anchors = {"baseline": lane_history.anchor, "best": (best or {}).get("commit")}
        if child is not None:
            self.assessor.judge_child(facts, *child, lane_history.genesis.get("expected", {}), freeze=False)
            if judged_files is not None:  # after judging: a file forged for the comparison and left is caught
                self.preflight.check_judged_files_kept(judged_files, facts.problems)
        verdict, detail, row = build(facts, speed=child is not None)
        with uninterrupted():  # a history record without its tip ref (or the reverse) would be 12 for ever
            if lane_history is not None:
                try:
                    record = history.seal(self.lane.name, history_body(verdict, detail), lane_history.tip)
                    history.append(self.root, lane_history.path, record)
                    self.mirror_best(record.get("best"), facts.arch)
                except Exception as exc:  # the history is the truth: no record, no KEEP
                    facts.problems.append((Category.CRASH, f"could not append to the lane history: {exc}"))
                    verdict, detail, row = build(facts, speed=False)
            return self.write(verdict, detail, row)

    def mirror_best(self, best: dict[str, Any] | None, arch: str | None) -> None:
        """Copy a new best to ``<artefacts>/best/`` for advisory ``--ditgate-lane`` runs (best effort; the
        judge itself only ever reads the lane's history)."""

        if best is None or arch is None:
            return
        try:
            store_best(self.artefacts, self.lane.name, arch, best)
        except OSError as exc:
            print(f"ditgate: could not mirror the lane best under {self.artefacts}: {exc}", file=sys.stderr)

    def write(self, verdict: Any, detail: dict[str, Any], row: dict[str, Any]) -> int:
        try:
            append_experiment(self.artefacts, row, detail)
            atomic_write_json(self.artefacts / VERDICT_FILE, detail)
        except OSError as exc:
            print(f"ditgate: could not write the ledger under {self.artefacts}: {exc}", file=sys.stderr)
            return EXIT_CODES["crash"]
        return self.report(verdict, detail.get("quality"))

    def report(self, verdict: Any, quality: list[dict[str, Any]] | None = None) -> int:
        print("\n".join(verdict.lines()))
        for note in sorted({q["judged_on"] for q in quality or () if q.get("judged_on")}):
            print(f"note: {note}")
        print(f"verdict: {self.artefacts / VERDICT_FILE}")
        return verdict.exit_code

    def finish_baseline_refused(self) -> Any:
        verdict, detail, row = build(self.facts(None, None), speed=False)
        self.write(verdict, detail, row)
        return verdict

    def record_baseline(self, lock_changes: list[str]) -> tuple[int, bool]:
        """Two runs of the lane's tests, then the lock, the commit and the history: ``(exit code, committed)``.
        The first run freezes the goldens that are missing. The second runs exactly as every later experiment
        does (goldens checked, not frozen; the same child, the same judging), and its ratio is the lane's first
        best: a best measured otherwise than the candidates it is compared with (the freezing run's ratio read
        0.114 where later runs of the same code read 0.076) keeps the first no-op after a baseline as a
        speedup. The second run must also match the goldens the first froze: a lane whose outputs change from
        run to run has no baseline."""
        from pytest_ditgate.golden.fixed_paths import write_lock

        parent = git.head(self.root)
        frozen = self.facts(None, None, arch=child_process.machine_arch())
        out = self.new_run_folder()
        self.assessor.judge_child(frozen, out, self.run_child(out, freeze=True, best=None), {}, freeze=True)
        verdict, detail, row = build(frozen, speed=False)
        if verdict.label != "keep":
            return self.write(verdict, detail, row), False
        facts = self.facts(None, None, arch=frozen.arch)
        facts.description = facts.description or "baseline"
        out = self.new_run_folder()
        self.assessor.judge_child(facts, out, self.run_child(out, freeze=False, best=None),
                         {"outputs": frozen.outputs_seen}, freeze=False)
        verdict, detail, row = build(facts)
        if verdict.label == "keep" and verdict.objective is None:
            facts.problems.append((Category.CRASH, "the baseline run made no side-by-side comparison"))
            verdict, detail, row = build(facts, speed=False)
        if verdict.label != "keep":
            return self.write(verdict, detail, row), False
        expected = {"outputs": facts.outputs_seen,
                    "comparisons": sorted(c["name"] for c in facts.comparisons if not c["versus_best"]),
                    "reference_medians": {c["name"]: c["reference_median_ms"] for c in facts.comparisons}}
        genesis = history.seal(self.lane.name, {"kind": "genesis", "parent": parent, "time_utc": detail["time_utc"],
                                                "expected": expected, "lock_changes": lock_changes}, None)
        write_lock(self.lock, lanes={self.lane.name: {"genesis": genesis["hash"]}})
        anchor = git.commit_all(self.root, f"ditgate baseline: lane {self.lane.name}")
        detail["commit"] = row["commit"] = git.short(anchor)
        path = history.history_path(self.artefacts, self.lane.name)
        history.append(self.root, path, genesis)
        best = {"objective": {k: verdict.objective[k] for k in ("ratio", "ci_low", "ci_high", "metric")},
                "commit": anchor, "time_utc": detail["time_utc"], "candidate_config": facts.candidate_config,
                "comparisons": facts.comparisons}
        history.append(self.root, path, history.seal(self.lane.name, {"kind": "anchor", "anchor": anchor,
                                                                      "best": best}, genesis))
        self.mirror_best(best, facts.arch)
        print(f"ditgate: lane {self.lane.name!r}: baseline committed as {anchor[:12]}; history {path}")
        return self.write(verdict, detail, row), True


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) back until the block is done: the records it writes belong together. A signal that
    came meanwhile goes to the handler it was meant for when the block ends. (A handler, not a signal mask: in a
    process with threads, such as one that imported torch, a masked signal is taken by another thread.)"""

    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread receives signals, and may set a handler
        return
    held: list[Any] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if held and callable(previous):
        previous(signal.SIGINT, held[0])
