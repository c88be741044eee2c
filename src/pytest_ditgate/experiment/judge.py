"""The deciding process of ``ditgate experiment`` and ``ditgate baseline``.

Started by the CLI as ``python -B -P -c <bootstrap> <root> ...`` (``bootstrap.JUDGE``): no project
bytecode, no current folder on ``sys.path``. It checks the environment, the fixed-paths lock, the lane's
history and the scope against the lane's anchors; runs the lane's tests in ONE child pytest process that
writes outputs and timing samples to a fresh folder; judges that evidence with fixed code; and writes the
verdict, the ledger row and the history record, all from one :class:`~pytest_ditgate.verdict.Verdict`.

This module puts the steps in order; each lives in a module of its own: the checks before and around the
run (``preflight.py``), the child (``child_process.py``), its evidence and the judge's timing of the lane
(``assess.py``), the verdict (``record.py``) and where it goes (``publish.py``), and a baseline's writes (``baseline.py``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pytest_ditgate import git
from pytest_ditgate.artefacts import resolve_artefact_dir
from pytest_ditgate.errors import DitgateUsageError
from pytest_ditgate.experiment import child_process, history
from pytest_ditgate.experiment.assess import Assessor
from pytest_ditgate.experiment.baseline import BaselineTransaction
from pytest_ditgate.experiment.policy import recorded_environment
from pytest_ditgate.experiment.preflight import Preflight, baseline_problems
from pytest_ditgate.experiment.publish import Publisher
from pytest_ditgate.experiment.record import Facts, build, history_body
from pytest_ditgate.experiment.transaction import uninterrupted
from pytest_ditgate.fsutil import lock_for
from pytest_ditgate.project_config import load_project_config, string_list
from pytest_ditgate.quality.specs import EXPERIMENT_CLASSES
from pytest_ditgate.verdict.outcome import EXIT_CODES, Category, Verdict

#: exit status of a run that cannot start (an unknown lane, a setting, a tree that is not ready), as pytest's
EXIT_USAGE = 4
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
    except KeyboardInterrupt:  # reading the settings writes nothing
        print(f"ditgate: {args.mode} of lane {args.lane!r} interrupted before it began", file=sys.stderr)
        return 130
    try:
        return judge.baseline() if args.mode == "baseline" else judge.experiment()
    except KeyboardInterrupt:  # a baseline puts the tree back itself; an experiment records nothing unfinished
        print(f"ditgate: {args.mode} of lane {args.lane!r} interrupted", file=sys.stderr)
        return 130


class Judge:
    """One run of the judge on one lane: an experiment or a baseline, step by step."""

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
        self.transaction = BaselineTransaction(root, self.lock, self.artefacts, self.lane.name)
        self.publisher = Publisher(self.artefacts, self.lane.name)

    # -- the two modes ------------------------------------------------------------------------------
    def experiment(self) -> int:
        from pytest_ditgate.golden.fixed_paths import read_lock

        path = history.history_path(self.artefacts, self.lane.name)
        with lock_for(path.with_suffix(".run")):  # concurrent experiments on one lane run one after the other
            branch = git.work_tree_problem(self.root) or git.branch_problem(self.root)
            if branch:  # a KEEP there belongs to no branch: once HEAD moves on, git deletes the lane's best
                print(f"ditgate: refused: {branch}", file=sys.stderr)
                return EXIT_USAGE
            self.preflight.check_environment()
            self.preflight.check_lock()
            self.preflight.check_own_modules()
            lanes = read_lock(self.lock).get("lanes") or {}
            genesis = lanes.get(self.lane.name, {}).get("genesis")
            lane_history, best, changed = self.read_history(genesis, lanes)
            if self.preflight.problems:
                return self.finish(lane_history, best, changed, None)
            if self.preflight.refuse_uncommitted():
                return EXIT_USAGE
            ref_locked = history.ref_lock_problem(self.root, self.lane.name)
            if ref_locked:  # the verdict could not be recorded: say so before the run, not after it
                print(f"ditgate: refused: {ref_locked}", file=sys.stderr)
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

        transaction = self.transaction
        if transaction.recorded():
            return transaction.refuse_second()
        problems = baseline_problems(self.root, self.project, self.lane.tests, self.artefacts,
                                     transaction.history_file, transaction.store) + transaction.problems()
        if problems:
            for problem in problems:
                print(f"ditgate: cannot record a baseline: {problem}", file=sys.stderr)
            return EXIT_USAGE
        with lock_for(transaction.history_file.with_suffix(".run")):
            if transaction.recorded():  # another baseline of this lane finished while this one waited
                return transaction.refuse_second()
            self.preflight.check_environment()
            if self.preflight.problems:
                return self.publisher.report(self.finish_baseline_refused())
            self.preflight.check_lock()
            lock_changes = [text for _, text in self.preflight.problems]
            self.preflight.problems.clear()  # the maintainer's baseline relocks; what changed is recorded for review
            snapshot = transaction.snapshot()
            try:
                code, committed = self.record_baseline(lock_changes)
            except BaseException as exc:
                transaction.undo(snapshot, f"stopped by {type(exc).__name__}" + (f": {exc}" if str(exc) else ""))
                if isinstance(exc, KeyboardInterrupt):
                    return 130
                return EXIT_CODES["crash"]
            if not committed:
                transaction.undo(snapshot, f"the baseline run was not green (exit code {code})")
            return code

    # -- the steps ----------------------------------------------------------------------------------
    def read_history(self, genesis: str | None, lanes: dict[str, Any]) -> tuple[Any, dict[str, Any] | None,
                                                                                  list[str] | None]:
        """The lane's history, its best and the paths changed since the anchors (each None where the history
        does not hold, which is a problem). ``lanes``: the lock's lanes, whose recorded baseline commits are the
        maintainer's changes, not this lane's."""
        lane_history = best = changed = None
        try:
            lane_history = history.read_history(self.root, self.artefacts, self.lane.name, genesis_hash=genesis)
            best = lane_history.best()
            anchor = lane_history.anchor
            if anchor is None or not git.is_ancestor(self.root, anchor):
                raise history.HistoryError(f"the lane's baseline commit {anchor} is not an ancestor of HEAD")
            others = history.baseline_commits(self.root, self.artefacts, lanes, self.lane.name)
            changed = self.preflight.check_scope([("baseline commit", anchor), ("best's commit", best["commit"])],
                                                 others)
        except history.HistoryError as exc:
            self.preflight.problems.append((Category.INTEGRITY, f"lane history: {exc}"))
        return lane_history, best, changed

    def record_baseline(self, lock_changes: list[str]) -> tuple[int, bool]:
        """Two runs of the lane's tests, then the lock, the commit and the history: ``(exit code, committed)``.
        The first run freezes the goldens that are missing. The second runs exactly as every later experiment
        does (goldens checked, not frozen; the same child, the same judging), and its ratio is the lane's first
        best: a best measured otherwise than the candidates it is compared with (the freezing run's ratio read
        0.114 where later runs of the same code read 0.076) keeps the first no-op after a baseline as a
        speedup. The second run must also match the goldens the first froze: a lane whose outputs change from
        run to run has no baseline."""
        parent = git.head(self.root)
        frozen = self.facts(None, None, arch=child_process.machine_arch())
        out = self.new_run_folder()
        self.assessor.judge_child(frozen, out, self.run_child(out, freeze=True, best=None), {}, freeze=True)
        verdict, detail, row = build(frozen, speed=False)
        if verdict.label != "keep":
            return self.publisher.write(verdict, detail, row), False
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
            return self.publisher.write(verdict, detail, row), False
        best = self.transaction.commit(parent, facts, verdict, detail, row, lock_changes)
        self.publisher.mirror_best(best, facts.arch)
        print(f"ditgate: lane {self.lane.name!r}: baseline committed as {best['commit'][:12]}; "
              f"history {self.transaction.history_file}")
        return self.publisher.write(verdict, detail, row), True

    def run_child(self, out: Path, *, freeze: bool, best: dict[str, Any] | None) -> int:
        """The lane's tests in the child process, writing into ``out``; its exit code."""
        return child_process.run_child(self.root, self.lane, self.declared, self.env, out, freeze=freeze, best=best)

    def new_run_folder(self) -> Path:
        """A fresh folder under ``<artefacts>/runs/`` for one child's evidence."""
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
        base = self.artefacts / RUNS_DIR
        base.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f"{self.lane.name}-{stamp}-", dir=base)) / "child"

    def facts(self, best: dict[str, Any] | None, changed: list[str] | None, *, arch: str | None = None) -> Facts:
        """The facts of this run before the child's evidence: the commit, the lane, the environment."""
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

    # -- deciding and writing -----------------------------------------------------------------------
    def finish(self, lane_history: Any, best: dict[str, Any] | None, changed: list[str] | None,
               child: tuple[Path, int] | None, judged_files: dict[str, str] | None = None) -> int:
        """Judge the child's evidence (if it ran), build the verdict, append it to the lane's history and write
        it; the exit code."""
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
                    pinned = (record.get("best") or best or {}).get("commit")
                    if pinned:  # a lane recorded before best refs existed gets its best pinned here
                        history.pin_best(self.root, self.lane.name, pinned)
                    history.append(self.root, lane_history.path, record)
                    self.publisher.mirror_best(record.get("best"), facts.arch)
                except Exception as exc:  # the history is the truth: no record, no KEEP
                    facts.problems.append((Category.CRASH, f"could not append to the lane history: {exc}"))
                    verdict, detail, row = build(facts, speed=False)
            return self.publisher.write(verdict, detail, row)

    def finish_baseline_refused(self) -> Verdict:
        """Write the verdict of a baseline refused before its run."""
        verdict, detail, row = build(self.facts(None, None), speed=False)
        self.publisher.write(verdict, detail, row)
        return verdict
