"""Experiment mode: ``pytest --ditgate --ditgate-lane=<lane> [--ditgate-class=...]`` judges the working
tree as a candidate and turns the run into KEEP / DISCARD (reason) / CRASH.

Outcome collection works under pytest-xdist: gate reason codes and side-by-side comparisons travel to
the controller as ``user_properties`` of test reports; only the controller decides and writes.
"""

from __future__ import annotations

import datetime as _dt
import re
from pathlib import Path
from typing import Any

import pytest

from pytest_ditgate import options
from pytest_ditgate.bench.plugin import COMPARISON_PROPERTY
from pytest_ditgate.context import get_context
from pytest_ditgate.errors import GateFailure
from pytest_ditgate.verdict.lane import CONFIG_PROPERTY, LANE_BEST_LABEL
from pytest_ditgate.verdict.options import BASE, DESCRIPTION, LANE, MIN_IMPROVEMENT, VERDICT_JSON

REASON_PROPERTY = "ditgate_reason"
CLASS_EVIDENCE_PROPERTY = "ditgate_class_evidence"
PEAK_MEMORY_PROPERTY = "ditgate_peak_memory_bytes"


class ExperimentSession:
    """Collects the run's outcomes (controller side) and produces the verdict at session end."""

    def __init__(self, config: pytest.Config) -> None:
        from pytest_ditgate.project_config import load_project_config

        self.config = config
        self.context = get_context(config)
        self.lane = options.get_option(config, LANE)
        self.verdict_json = options.get_option(config, VERDICT_JSON)
        self.description = options.get_option(config, DESCRIPTION) or ""
        self.base = options.get_option(config, BASE)
        self.min_improvement = float(options.get_option(config, MIN_IMPROVEMENT) or 0.0)
        self.project = load_project_config(config.rootpath)
        self.outcomes: dict[str, Any] = {}
        self.comparisons: list[dict[str, Any]] = []
        self.candidate_config: dict[str, Any] = {}
        self.class_evidence: list[str] = []
        self.quality: list[dict[str, Any]] = []
        self.peak_memory: int | None = None
        self.session_problems: list[tuple[Any, str]] = []
        self.changed: list[str] | None = None
        self.verdict = None
        self.notes: list[str] = []
        self.verdict_json_failed = False
        if self.verdict_json:
            check_verdict_json_path(Path(self.verdict_json))

    # -- collection -------------------------------------------------------------------------------
    def add_report(self, report: pytest.TestReport) -> None:
        from pytest_ditgate.verdict.outcome import GateOutcome

        reason = dict(report.user_properties).get(REASON_PROPERTY)
        for key, value in report.user_properties:
            if key == COMPARISON_PROPERTY and report.when == "call":
                self.comparisons.append(dict(value, name=value.get("name") or report.nodeid))
            elif key == CONFIG_PROPERTY and report.when == "call":
                self.candidate_config.update(value)
            elif key == CLASS_EVIDENCE_PROPERTY and report.when == "call":
                self.class_evidence.extend(str(v) for v in value)
            elif key == PEAK_MEMORY_PROPERTY and report.when == "call":
                self.peak_memory = max(self.peak_memory or 0, int(value))
        for record in getattr(report, "ditgate_quality", None) or []:
            self.quality.append(dict(record, test=report.nodeid))
        if report.skipped and report.nodeid not in self.outcomes:
            self.outcomes[report.nodeid] = GateOutcome(report.nodeid, "skipped")
        elif report.failed:
            outcome = "failed" if report.when == "call" or reason else "error"
            crash = getattr(report.longrepr, "reprcrash", None)
            message = crash.message if crash is not None else (report.longreprtext.strip().splitlines() or [""])[-1]
            message = re.sub(r"^[\w.]*GateFailure: \[[\w-]+\] ", "", message)
            self.outcomes[report.nodeid] = GateOutcome(report.nodeid, outcome, reason, message)
        elif report.passed and report.when == "call":
            self.outcomes.setdefault(report.nodeid, GateOutcome(report.nodeid, "passed"))

    # -- session-level checks ---------------------------------------------------------------------
    def check_scope(self) -> None:
        from pytest_ditgate.project_config import string_list
        from pytest_ditgate.verdict.outcome import Category
        from pytest_ditgate.verdict.scope import GitError, changed_paths, resolve_base, scope_violations

        mutable = string_list(self.project, "mutable_paths")
        fixed = string_list(self.project, "fixed_paths")
        if not mutable and not fixed:
            self.notes.append("scope: no mutable_paths/fixed_paths in [tool.ditgate]; not checked")
            return
        root = Path(self.config.rootpath)
        try:
            base = resolve_base(root, self.base)
            changed = changed_paths(root, base)
        except GitError as exc:
            self.session_problems.append((Category.SCOPE, f"cannot determine the candidate's changes: {exc}"))
            return
        self.changed = changed
        for problem in scope_violations(changed, mutable, fixed):
            self.session_problems.append((Category.SCOPE, problem))

    def check_fixed_paths(self) -> list[str]:
        """Lines describing fixed paths changed since the lock (empty when intact, unlocked or deliberate)."""
        from pytest_ditgate.golden.fixed_paths import LockSettings, evaluate_lock
        from pytest_ditgate.golden.options import FREEZE, REFREEZE, RELOCK

        if any(options.get_option(self.config, spec) for spec in (RELOCK, FREEZE, REFREEZE)):
            return []
        settings = LockSettings.from_rootdir(Path(self.config.rootpath))
        if not settings.patterns:
            return []
        verdict = evaluate_lock(settings)
        return list(verdict.lines()) if verdict.changed else []

    # -- decision ---------------------------------------------------------------------------------
    def finish(self, session: pytest.Session) -> None:
        from pytest_ditgate.verdict.classify import classify_tagged
        from pytest_ditgate.verdict.ledger import append_experiment, load_best, store_best
        from pytest_ditgate.verdict.objective import beats_best, combine, improvement_pct
        from pytest_ditgate.verdict.outcome import Category, GateOutcome, decide

        from pytest_ditgate.verdict.candidate import declared_class

        declared = declared_class(self.config)
        classification = classify_tagged(declared, self.class_evidence)
        versus_best = [c for c in self.comparisons if _is_versus_best(c)]
        objective = combine([c for c in self.comparisons if not _is_versus_best(c)])
        arch = _arch(self)
        root = self.context.artefact_dir
        best = None
        try:
            best = load_best(root, self.lane, arch) if self.lane else None
        except ValueError as exc:
            self.session_problems.append((Category.INTEGRITY, str(exc)))
        if objective is not None and self.lane:
            better, why = beats_best(objective, best, min_improvement=self.min_improvement,
                                     remeasured=combine(versus_best))
            objective["vs_best"] = why
            if not better:
                self.session_problems.append((Category.PERFORMANCE, why))
        if session.exitstatus in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.INTERNAL_ERROR):
            self.outcomes["<session>"] = GateOutcome("<session>", "error", None, "the run was interrupted")
        self.verdict = decide(self.outcomes.values(), session_problems=self.session_problems,
                              experiment_class=classification.effective, declared_class=declared,
                              lane=self.lane, objective=objective)
        commit, parent = _commits(Path(self.config.rootpath))
        environment = _environment(self)
        detail = {
            "time_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "verdict": self.verdict.to_dict(), "commit": commit, "parent": parent, "arch": arch,
            "classification": {"declared": declared, "effective": classification.effective,
                               "evidence": list(classification.evidence)},
            "comparisons": self.comparisons, "quality": self.quality, "best_before": best,
            "candidate_config": self.candidate_config or None,
            "peak_memory_bytes": self.peak_memory, "description": self.description,
            "changed_paths": self.changed, "environment": environment, "notes": self.notes,
        }
        if self.lane:
            row = {
                "timestamp": detail["time_utc"], "commit": commit, "parent": parent, "status": self.verdict.label,
                "class": classification.effective,
                "objective_metric": objective["metric"] if objective else "",
                "best_before": best["objective"]["ratio"] if best else None,
                "candidate": objective["ratio"] if objective else None,
                "improvement_pct": improvement_pct(objective, best) if objective else None,
                "peak_vram_gb": self.peak_memory / 2**30 if self.peak_memory else None,
                "quality": _quality_cell(self.quality, self.verdict),
                "description": self.description,
            }
            try:
                append_experiment(root, row, detail)
                if self.verdict.label == "keep" and objective is not None:
                    store_best(root, self.lane, arch, {"objective": objective, "commit": commit,
                                                       "time_utc": detail["time_utc"], "environment": environment,
                                                       "candidate_config": self.candidate_config or None,
                                                       "comparisons": self.full_comparisons()})
            except OSError as exc:
                self.notes.append(f"could not write the ledger under {root}: {exc}")
        if self.verdict_json:
            from pytest_ditgate.fsutil import atomic_write_json

            try:
                atomic_write_json(Path(self.verdict_json), detail)
            except OSError as exc:
                self.notes.append(f"could not write the verdict JSON {self.verdict_json}: {exc}")
                self.verdict_json_failed = True

    def full_comparisons(self) -> list[dict[str, Any]]:
        """This run's comparisons with their raw samples, from the bench ledger (the lane best keeps them)."""
        from pytest_ditgate.bench.ledger import LEDGER_FILE
        from pytest_ditgate.fsutil import read_jsonl_report

        tests = {c.get("test") for c in self.comparisons}
        latest: dict[str, dict[str, Any]] = {}
        content = read_jsonl_report(self.context.artefact_dir / LEDGER_FILE)
        if content.skipped_message():
            self.notes.append(f"lane best samples: {content.skipped_message()}")
        for record in content.records:
            if record.get("kind") == "comparison" and record.get("lane") == self.lane and record.get("test") in tests:
                latest[record["test"]] = record
        return list(latest.values()) or self.comparisons

    # -- hooks (this object is registered as a plugin in experiment mode) ---------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Scope and integrity are judged before any test runs; a broken lock ends the run here, logged."""
        from pytest_ditgate.verdict.outcome import Category

        self.check_scope()
        changed = self.check_fixed_paths()
        if not changed:
            return
        for line in changed:
            self.session_problems.append((Category.INTEGRITY, f"fixed path changed: {line.strip()}"))
        self.finish(session)
        pytest.exit("ditgate: fixed paths changed; the candidate is rejected before any test runs:\n  "
                    + "\n  ".join(changed) + f"\nVERDICT: {self.verdict.headline()}",
                    returncode=self.verdict.exit_code)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.add_report(report)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.finish(session)
        if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
            session.exitstatus = self.verdict.exit_code
        if self.verdict_json_failed:  # whoever waits for that file must not read an old one as this verdict
            session.exitstatus = pytest.ExitCode.USAGE_ERROR

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.verdict is None:
            return
        verdict = self.verdict
        terminalreporter.section("ditgate verdict", sep="=", bold=True,
                                 green=verdict.label == "keep", red=verdict.label != "keep")
        terminalreporter.write_line(f"VERDICT: {verdict.headline()}  (exit code {verdict.exit_code})", bold=True)
        if verdict.declared_class != verdict.experiment_class:
            terminalreporter.write_line(f"class: declared {verdict.declared_class}, judged as {verdict.experiment_class}")
        if verdict.objective:
            o = verdict.objective
            terminalreporter.write_line(
                f"objective: {o['metric']}: {o['ratio']:.4f} (CI {o['ci_low']:.4f}..{o['ci_high']:.4f})"
                + (f"; {o['vs_best']}" if o.get("vs_best") else ""))
        for reason in verdict.reasons[:20]:
            terminalreporter.write_line(f"  - {reason}")
        for note in self.notes:
            terminalreporter.write_line(f"note: {note}")


def _is_versus_best(comparison: dict[str, Any]) -> bool:
    return str(comparison.get("name", "")).endswith(f"/ {LANE_BEST_LABEL}")


def _arch(experiment: ExperimentSession) -> str:
    for comparison in experiment.comparisons:
        if comparison.get("arch"):
            return comparison["arch"]
    from pytest_ditgate.device import real_device

    return real_device().arch


def _commits(root: Path) -> tuple[str | None, str | None]:
    """(commit, parent) of the candidate: ``$DITGATE_COMMIT`` names the commit of a copied tree (whose
    .git may be stale), its parent is then unknown; else git's short HEAD and HEAD^."""
    import os
    import subprocess

    from pytest_ditgate.environment import COMMIT_ENV

    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV], None

    def rev(name: str) -> str | None:
        proc = subprocess.run(["git", "rev-parse", "--short=12", name], cwd=root, capture_output=True, text=True)
        return proc.stdout.strip() or None if proc.returncode == 0 else None

    return rev("HEAD"), rev("HEAD^")


def _environment(experiment: ExperimentSession) -> dict[str, Any]:
    from pytest_ditgate.device import real_device
    from pytest_ditgate.environment import environment_record

    return environment_record(real_device(), cwd=experiment.config.rootpath)


def _quality_cell(quality: list[dict[str, Any]], verdict: Any) -> str:
    failed = [q for q in quality if not q.get("passed", True)]
    if failed:
        return f"FAIL {len(failed)}/{len(quality)} cases"
    if quality:
        return f"ok {len(quality)} cases"
    return "fail" if verdict.category is not None and verdict.category.value == "quality" else "ok"


_session_key = pytest.StashKey[ExperimentSession]()


def check_verdict_json_path(path: Path) -> None:
    """``--ditgate-verdict-json`` must name a file that can be written: a usage error before any test runs."""
    flag = f"--ditgate-verdict-json={path}"
    if path.is_dir():
        raise pytest.UsageError(f"{flag}: is a folder; give the path of a JSON file to write")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise pytest.UsageError(f"{flag}: {parent} is not a folder")
    import os

    if not os.access(parent, os.W_OK | os.X_OK):
        raise pytest.UsageError(f"{flag}: {parent} is not writable")


def experiment(config: pytest.Config) -> ExperimentSession | None:
    """The run's experiment session (controller side), or None outside experiment mode."""
    return config.stash.get(_session_key, None)


def pytest_configure(config: pytest.Config) -> None:
    if get_context(config).is_xdist_worker:
        return
    if options.get_option(config, LANE) or options.get_option(config, VERDICT_JSON):
        session = ExperimentSession(config)
        config.stash[_session_key] = session
        config.pluginmanager.register(session, "ditgate-experiment")


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(_session_key, None)
    if session is not None:
        config.pluginmanager.unregister(session)
        del config.stash[_session_key]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    """Tag a report with the gate's reason code so the controller can classify the failure."""
    report = yield
    if call.excinfo is not None and isinstance(call.excinfo.value, GateFailure):
        report.user_properties.append((REASON_PROPERTY, call.excinfo.value.reason))
    if call.when == "call":
        from pytest_ditgate.verdict.candidate import take_unsent_evidence

        evidence = take_unsent_evidence(item.config)
        if evidence:
            report.user_properties.append((CLASS_EVIDENCE_PROPERTY, evidence))
        peak = _peak_device_memory()
        if peak:
            report.user_properties.append((PEAK_MEMORY_PROPERTY, peak))
    return report


def _peak_device_memory() -> int | None:
    """This process's peak CUDA memory so far (None when it never used CUDA; torch is never imported here)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    return int(torch.cuda.max_memory_allocated())
