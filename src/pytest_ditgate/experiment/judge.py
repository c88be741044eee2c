"""The deciding process of ``ditgate experiment`` and ``ditgate baseline``.

Started by the CLI as ``python -B -P -c <bootstrap> <root> ...`` (``bootstrap.JUDGE``): no project
bytecode, no current folder on ``sys.path``. It checks the environment, the fixed-paths lock, the lane's
history and the scope against the lane's anchors; runs the lane's tests in ONE child pytest process that
writes outputs and timing samples to a fresh folder; judges that evidence with fixed code; and writes the
verdict, the ledger row and the history record, all from one :class:`~pytest_ditgate.verdict.Verdict`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pytest_ditgate.verdict.outcome import Category, EXIT_CODES

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
        return 4
    return judge.baseline() if args.mode == "baseline" else judge.experiment()


class Judge:
    def __init__(self, root: Path, args: argparse.Namespace) -> None:
        from pytest_ditgate.errors import DitgateUsageError
        from pytest_ditgate.artefacts import resolve_artefact_dir
        from pytest_ditgate.verdict.lane import load_lane
        from pytest_ditgate.golden.fixed_paths import LockSettings
        from pytest_ditgate.project_config import load_project_config, string_list

        self.root = root
        self.args = args
        try:
            self.project = load_project_config(root)
            self.lane = load_lane(self.project, args.lane)
            self.lock = LockSettings.from_rootdir(root)
            self.mutable = string_list(self.project, "mutable_paths")
        except DitgateUsageError as exc:
            raise Refused(str(exc)) from None
        declared = args.cls or self.lane.default_class
        from pytest_ditgate.quality.specs import EXPERIMENT_CLASSES

        if declared not in EXPERIMENT_CLASSES:
            raise Refused(f"--class {declared!r}: choose from {', '.join(EXPERIMENT_CLASSES)}")
        self.declared = declared
        # DITGATE_DIR is refused below, so the artefact folder is the project's
        self.artefacts = resolve_artefact_dir(root, env={}, table=self.project)
        self.problems: list[tuple[Category, str]] = []
        self.env = dict(os.environ)
        #: relative path -> sha256 of every fixed file, as check_lock found them
        self.fixed_files: dict[str, str] | None = None

    # -- preflight: what is checked before anything runs --------------------------------------------
    def fixed_patterns(self) -> list[str]:
        lock_rel = self.lock.lock_path.relative_to(self.root).as_posix()
        return [*self.lock.patterns, lock_rel, "golden/"]

    def check_environment(self) -> None:
        from pytest_ditgate.experiment.policy import refused_environment

        for line in refused_environment(self.env, self.root, self.fixed_patterns()):
            self.problems.append((Category.INTEGRITY, line))

    def check_lock(self) -> None:
        from pytest_ditgate.golden.fixed_paths import evaluate_lock, expand

        self.fixed_files = expand(self.lock)  # hashed once: check_own_modules needs the same list
        verdict = evaluate_lock(self.lock, now=self.fixed_files)
        for line in verdict.lines() if verdict.changed else []:
            self.problems.append((Category.INTEGRITY, f"fixed paths: {line.strip()}"))

    def judged_files(self, known: dict[str, str] | None = None) -> dict[str, str]:
        """sha256 of every file the judge reads once the child ran: the lock's files (the classifier's module
        and weights among them), and the goldens, their manifest and the quality contract even where the lock
        does not name them. ``known``: digests taken a moment before (no candidate code ran since). A contract
        outside the project (an absolute path, the packaged default of an installed plugin) is hashed too,
        under its absolute path."""
        from dataclasses import replace

        from pytest_ditgate.golden.fixed_paths import expand
        from pytest_ditgate.golden.store import sha256_bytes

        extras = ["golden/"]
        contract = self.contract()
        relative = self._relative(contract)
        if relative:
            extras.append(relative.rstrip("/"))
        digests = expand(replace(self.lock, patterns=tuple(dict.fromkeys([*self.lock.patterns, *extras]))), known)
        if not relative:
            try:
                digests[str(contract.resolve())] = sha256_bytes(contract.read_bytes())
            except OSError:
                pass  # no contract to read: the quality session in the child says so
        return digests

    def check_judged_files_kept(self, before: dict[str, str], problems: list[tuple[Category, str]]) -> None:
        """The candidate's process runs as this user: it could rewrite a golden, its manifest or the contract
        while it runs, and be judged against its own. What the judge read must be what it hashed before."""
        now = self.judged_files()
        for path in sorted(before.keys() | now.keys()):
            if before.get(path) != now.get(path):
                what = "removed" if path not in now else "added" if path not in before else "rewritten"
                problems.append((Category.INTEGRITY, f"{path}: {what} while the candidate's process ran (a fixed "
                                                     "file the judge reads)"))

    def check_own_modules(self) -> None:
        """Every module this process imported from inside the project must be a locked, unchanged file."""
        from pytest_ditgate.golden.fixed_paths import expand

        locked = self.fixed_files if self.fixed_files is not None else expand(self.lock)
        real_root = self.root.resolve()
        for name, module in sorted(sys.modules.items()):
            file = getattr(module, "__file__", None)
            if not file:
                continue
            try:
                relative = Path(file).resolve().relative_to(real_root).as_posix()
            except ValueError:
                continue
            if relative.startswith((".venv/", "venv/")) or "/site-packages/" in relative:
                continue
            if relative not in locked:
                self.problems.append((Category.INTEGRITY, f"the judge imported {name} from {relative}, which the "
                                                          "fixed-paths lock does not cover"))

    def check_scope(self, anchors: list[tuple[str, str]]) -> list[str]:
        from pytest_ditgate import git
        from pytest_ditgate.verdict.scope import matches

        artefacts = self._relative(self.artefacts)
        fixed = self.fixed_patterns()
        changed: set[str] = set()
        for label, commit in anchors:
            try:
                paths = git.changed_since(self.root, commit)
            except git.GitError as exc:
                self.problems.append((Category.INTEGRITY, f"cannot diff against the {label} {commit[:12]}: {exc}"))
                continue
            changed.update(p for p in paths if not (artefacts and (p + "/").startswith(artefacts)))
        for path in sorted(changed):
            if any(matches(path, pattern) or _glob_match(path, pattern) for pattern in fixed):
                self.problems.append((Category.INTEGRITY, f"{path}: a fixed path, changed since the lane's anchors"))
            elif not any(matches(path, pattern) for pattern in self.mutable):
                self.problems.append((Category.SCOPE, f"{path}: outside the mutable paths "
                                                      f"({', '.join(self.mutable) or 'none declared'})"))
        return sorted(changed)

    def _relative(self, path: Path) -> str | None:
        try:
            return path.resolve().relative_to(self.root.resolve()).as_posix() + "/"
        except ValueError:
            return None

    # -- the child ----------------------------------------------------------------------------------
    def run_child(self, out: Path, *, freeze: bool, best: dict[str, Any] | None) -> int:
        import json

        from pytest_ditgate.experiment.bootstrap import CHILD, command
        from pytest_ditgate.judged_run import LANE_BEST, OUT_ENV

        out.mkdir(parents=True, exist_ok=False)
        if best is not None and best.get("candidate_config"):
            (out / LANE_BEST).write_text(json.dumps(best, default=str))
        env = {k: v for k, v in self.env.items() if not k.startswith(("DITGATE_", "PYTEST_"))}
        env[OUT_ENV] = str(out)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        args = ["--ditgate", f"--ditgate-lane={self.lane.name}", f"--ditgate-class={self.declared}",
                f"--ditgate-dir={out / 'artefacts'}", "-p", "pytest_ditgate.experiment.child",
                "-p", "no:cacheprovider", "-q", "-rfEs", "--durations=5", *(["--ditgate-freeze"] if freeze else []), *self.lane.tests]
        print("ditgate: judged run:", "pytest", " ".join(args), flush=True)
        overlap = cores_to_spare()
        child = subprocess.Popen(command(CHILD, str(self.root), *args), cwd=self.root, env=env)
        try:
            if overlap:
                _warm_imports()  # while the child runs: the comparison's imports cost the judge no wall time
        finally:
            returncode = child.wait()
        return returncode

    # -- the two modes ------------------------------------------------------------------------------
    def experiment(self) -> int:
        from pytest_ditgate import git
        from pytest_ditgate.experiment import history
        from pytest_ditgate.fsutil import lock_for
        from pytest_ditgate.golden.fixed_paths import read_lock

        path = history.history_path(self.artefacts, self.lane.name)
        with lock_for(path.with_suffix(".run")):  # concurrent experiments on one lane run one after the other
            self.check_environment()
            self.check_lock()
            self.check_own_modules()
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
                changed = self.check_scope([("baseline commit", anchor), ("best's commit", best["commit"])])
            except history.HistoryError as exc:
                self.problems.append((Category.INTEGRITY, f"lane history: {exc}"))
            if self.problems:
                return self.finish(lane_history, best, changed, None)
            judged_files = self.judged_files(known=self.fixed_files)  # the lock's files are hashed already
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
        from pytest_ditgate import git
        from pytest_ditgate.experiment import history
        from pytest_ditgate.fsutil import lock_for
        from pytest_ditgate.golden.fixed_paths import read_lock

        path = history.history_path(self.artefacts, self.lane.name)
        with lock_for(path.with_suffix(".run")):
            lanes = read_lock(self.lock).get("lanes") or {}
            if self.lane.name in lanes or git.read_blob_ref(self.root, history.ref_name(self.lane.name)) is not None:
                print(f"ditgate: lane {self.lane.name!r} already has a baseline (a baseline is recorded once; "
                      "declare a new lane for a new one)", file=sys.stderr)
                return 2
            self.check_environment()
            if self.problems:
                return self.report(self.finish_baseline_refused())
            self.check_lock()
            lock_changes = [text for _, text in self.problems]
            self.problems = []  # the maintainer's baseline relocks; what changed is recorded for review
            parent = git.head(self.root)
            out = self.new_run_folder()
            returncode = self.run_child(out, freeze=True, best=None)
            return self.finish_baseline(out, returncode, parent, lock_changes)

    # -- deciding and writing -----------------------------------------------------------------------
    def new_run_folder(self) -> Path:
        import datetime as _dt

        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
        base = self.artefacts / RUNS_DIR
        base.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f"{self.lane.name}-{stamp}-", dir=base)) / "child"

    def facts(self, best: dict[str, Any] | None, changed: list[str] | None, *, arch: str | None = None) -> Any:
        from pytest_ditgate import git
        from pytest_ditgate.experiment.policy import recorded_environment
        from pytest_ditgate.experiment.record import Facts

        head = git.head(self.root)
        return Facts(lane=self.lane.name, declared_class=self.declared, effective_class=self.declared,
                     class_evidence=[], description=self.args.description, commit=git.short(head),
                     parent=git.short(git.rev(self.root, "HEAD^")), arch=arch or "", problems=self.problems,
                     best_before=best, changed_paths=changed, min_improvement=self.lane.min_improvement,
                     environment={"variables": recorded_environment(self.env), "python": sys.executable,
                                  "plugin": str(Path(__file__).resolve().parents[1]),
                                  "lane": {"tests": list(self.lane.tests), "class": self.lane.default_class,
                                           "required": list(self.lane.required),
                                           "min_improvement": self.lane.min_improvement}})

    def judge_child(self, facts: Any, out: Path, returncode: int, expected: dict[str, Any], *, freeze: bool) -> None:
        from pytest_ditgate.experiment.evidence import judge_outputs, judge_timings, read_child, required_ran
        from pytest_ditgate.verdict.classify import classify_tagged

        evidence = read_child(out)
        facts.outcomes = list(evidence.outcomes.values())
        facts.child = {"folder": str(out), "exit_code": returncode, "ran": sorted(evidence.ran),
                       "observed": {k: evidence.observed.get(k)
                                    for k in ("modules", "gemms", "tf32_gemms", "ops", "scan_s", "collected")},
                       "unparsable_lines": evidence.skipped_lines}
        if returncode not in (0, 1):
            facts.problems.append((Category.CRASH, f"the lane's pytest run exited with {returncode} "
                                                   f"({'no tests collected' if returncode == 5 else 'not a test outcome'})"))
        for line in required_ran(evidence, self.lane.required):
            facts.problems.append((Category.CRASH, line))
        observed = evidence.observed
        if observed.get("observed"):
            print(f"ditgate: observed in the candidate's process: {observed.get('ops', 0)} ops "
                  f"({observed.get('gemms', 0)} GEMM/conv), {observed.get('modules', 0)} modules scanned "
                  f"in {float(observed.get('scan_s') or 0):.2f} s", flush=True)
        if evidence.ran and (not observed.get("observed") or not (observed.get("modules") or observed.get("gemms"))):
            facts.problems.append((Category.INTEGRITY, "class unchecked: the run recorded no observation of what "
                                                       "executed (no module, no GEMM/conv)"))
        quant = [f"quant: {e}" for e in observed.get("evidence", [])]
        tagged = quant + [str(e) for e in observed.get("declared", []) if str(e) not in quant]
        classification = classify_tagged(self.declared, tagged)
        facts.effective_class = classification.effective
        facts.class_evidence = list(classification.evidence)
        facts.candidate_config = observed.get("candidate_config") or None
        facts.comparisons = judge_timings(evidence, expected.get("comparisons", []),
                                          expected.get("reference_medians", {}), facts.problems)
        if not freeze:
            facts.quality = judge_outputs(self.root, evidence, expected.get("outputs", []), classification.effective,
                                          self.contract(), facts.arch, facts.problems)
        facts.outputs_seen = sorted({f"{o.get('name')}@{o.get('key')}" for o in evidence.outputs})

    def contract(self) -> Path:
        """The contract the child's quality session reads (a project without one gets the packaged default)."""
        from pytest_ditgate.quality.contract import contract_path_for

        raw = self.project.get("quality_contract")
        return contract_path_for(self.root, str(raw) if raw is not None else None)

    def finish(self, lane_history: Any, best: dict[str, Any] | None, changed: list[str] | None,
               child: tuple[Path, int] | None, judged_files: dict[str, str] | None = None) -> int:
        from pytest_ditgate.experiment import history
        from pytest_ditgate.experiment.record import build, history_body

        facts = self.facts(best, changed, arch=_arch() if child is not None else None)
        if lane_history is not None:
            facts.anchors = {"baseline": lane_history.anchor, "best": (best or {}).get("commit")}
        if child is not None:
            self.judge_child(facts, *child, lane_history.genesis.get("expected", {}), freeze=False)
            if judged_files is not None:  # after judging: a file forged for the comparison and left is caught
                self.check_judged_files_kept(judged_files, facts.problems)
        verdict, detail, row = build(facts, speed=child is not None)
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
        from pytest_ditgate.verdict.ledger import store_best

        if best is None or arch is None:
            return
        try:
            store_best(self.artefacts, self.lane.name, arch, best)
        except OSError as exc:
            print(f"ditgate: could not mirror the lane best under {self.artefacts}: {exc}", file=sys.stderr)

    def write(self, verdict: Any, detail: dict[str, Any], row: dict[str, Any]) -> int:
        from pytest_ditgate.fsutil import atomic_write_json
        from pytest_ditgate.verdict.ledger import append_experiment

        try:
            append_experiment(self.artefacts, row, detail)
            atomic_write_json(self.artefacts / VERDICT_FILE, detail)
        except OSError as exc:
            print(f"ditgate: could not write the ledger under {self.artefacts}: {exc}", file=sys.stderr)
            return EXIT_CODES["crash"]
        return self.report(verdict, detail.get("quality"))

    def report(self, verdict: Any, quality: list[dict[str, Any]] | None = None) -> int:
        print(f"VERDICT: {verdict.headline()}  (exit code {verdict.exit_code})")
        if verdict.declared_class != verdict.experiment_class:
            print(f"class: declared {verdict.declared_class}, judged as {verdict.experiment_class}")
        if verdict.objective:
            o = verdict.objective
            print(f"objective: {o['metric']}: {o['ratio']:.4f} (CI {o['ci_low']:.4f}..{o['ci_high']:.4f})"
                  + (f"; {o['vs_best']}" if o.get("vs_best") else ""))
        for reason in verdict.reasons[:20]:
            print(f"  - {reason}")
        for note in sorted({q["judged_on"] for q in quality or () if q.get("judged_on")}):
            print(f"note: {note}")
        print(f"verdict: {self.artefacts / VERDICT_FILE}")
        return verdict.exit_code

    def finish_baseline_refused(self) -> Any:
        from pytest_ditgate.experiment.record import build

        verdict, detail, row = build(self.facts(None, None), speed=False)
        self.write(verdict, detail, row)
        return verdict

    def finish_baseline(self, out: Path, returncode: int, parent: str | None, lock_changes: list[str]) -> int:
        from pytest_ditgate import git
        from pytest_ditgate.experiment import history
        from pytest_ditgate.experiment.record import build
        from pytest_ditgate.golden.fixed_paths import write_lock

        facts = self.facts(None, None, arch=_arch())
        facts.description = facts.description or "baseline"
        self.judge_child(facts, out, returncode, {}, freeze=True)
        verdict, detail, row = build(facts)
        if verdict.label != "keep" or verdict.objective is None:
            if verdict.objective is None and verdict.label == "keep":
                facts.problems.append((Category.CRASH, "the baseline run made no side-by-side comparison"))
                verdict, detail, row = build(facts, speed=False)
            return self.write(verdict, detail, row)
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
        return self.write(verdict, detail, row)


def _glob_match(path: str, pattern: str) -> bool:
    import fnmatch

    if "#" in pattern:
        return False  # a pyproject table: the lock judges it, scope judges the file itself
    if pattern.startswith("**/"):
        return fnmatch.fnmatch(path.rsplit("/", 1)[-1], pattern[3:])
    return False


#: the judge imports what it compares with while the child runs only on a machine with at least this many
#: usable CPUs. On fewer, its import thread takes a core from the candidate's timed torch threads: on two
#: cores a no-op's re-measure against the lane best can read 0.79 (CI 0.19..0.92), enough to keep it, because
#: calls take 1.4 ms or, whenever a thread of the child's pool waits for the core, 5.6 ms (a third of them)
OVERLAP_MIN_CPUS = 8


def cores_to_spare() -> bool:
    """Whether the judge can work beside its child without slowing the child's timed calls."""
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 1
    return usable >= OVERLAP_MIN_CPUS


def _warm_imports() -> None:
    """Import what judging the child's evidence needs (torch, safetensors, the quality evaluator and the
    image metrics it calls: torchmetrics' first import alone takes seconds)."""
    try:
        import safetensors.torch  # noqa: F401

        import pytest_ditgate.golden.session  # noqa: F401
        import pytest_ditgate.quality.evaluate  # noqa: F401
        _arch()
    except ImportError:
        return  # reported where it is needed
    try:
        import torchmetrics.functional.image  # noqa: F401
    except ImportError:
        pass  # optional: only image metrics need it


def _arch() -> str:
    """This machine's arch (no SDPA probe, no CUDA context: the child is using the device meanwhile)."""
    from pytest_ditgate.device import device_arch

    return device_arch()
