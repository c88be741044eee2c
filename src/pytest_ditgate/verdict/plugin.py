"""Advisory experiment mode: ``pytest --ditgate --ditgate-lane=<lane>`` turns a run into KEEP / DISCARD
(reason) / CRASH in the candidate's own process, for a quick look. It records nothing: only the judge
(``ditgate experiment``, :mod:`pytest_ditgate.experiment`) decides a lane's KEEP and writes its ledger and
history. Inside the judge's child run this session is not registered at all (the judge decides).

Outcome collection works under pytest-xdist: gate reason codes and side-by-side comparisons travel to
the controller as ``user_properties`` of test reports (names in :mod:`pytest_ditgate.report_properties`).
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any

import pytest

from pytest_ditgate import options
from pytest_ditgate.context import get_context
from pytest_ditgate.errors import GateFailure
from pytest_ditgate.report_properties import (CLASS_EVIDENCE_PROPERTY, COMPARISON_PROPERTY, CONFIG_PROPERTY,
                                              PEAK_MEMORY_PROPERTY, QUALITY_ATTRIBUTE, REASON_PROPERTY)
from pytest_ditgate.bench.options import LANE
from pytest_ditgate.verdict.options import DESCRIPTION, MIN_IMPROVEMENT, VERDICT_JSON


def _min_improvement(option: float | None, project: dict[str, Any], lane: str | None) -> float:
    """The option when given; else the floor the judge would use for a declared lane (advisory runs and the
    judge then keep the same candidates; an invalid one is the same usage error); else the default."""
    from pytest_ditgate.errors import DitgateUsageError
    from pytest_ditgate.verdict.lane import DEFAULT_MIN_IMPROVEMENT, load_lane

    if option is not None:
        return float(option)
    declared = project.get("lanes")
    if lane and isinstance(declared, dict) and lane in declared:
        try:
            return load_lane(project, lane).min_improvement
        except DitgateUsageError as exc:
            raise pytest.UsageError(str(exc)) from None
    return DEFAULT_MIN_IMPROVEMENT


class ExperimentSession:
    """Collects the run's outcomes (controller side) and produces the verdict at session end."""

    def __init__(self, config: pytest.Config) -> None:
        from pytest_ditgate.project_config import load_project_config

        self.config = config
        self.context = get_context(config)
        self.lane = options.get_option(config, LANE)
        self.verdict_json = options.get_option(config, VERDICT_JSON)
        self.description = options.get_option(config, DESCRIPTION) or ""
        self.project = load_project_config(config.rootpath)
        self.min_improvement = _min_improvement(options.get_option(config, MIN_IMPROVEMENT), self.project, self.lane)
        from pytest_ditgate.verdict.reports import OutcomeBook

        self.book = OutcomeBook()
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
            check_verdict_json_path(Path(self.verdict_json), Path(config.rootpath))

    # -- collection -------------------------------------------------------------------------------
    def add_report(self, report: pytest.TestReport) -> None:
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
        for record in getattr(report, QUALITY_ATTRIBUTE, None) or []:
            self.quality.append(dict(record, test=report.nodeid))
        self.book.add_report(report, reason)

    # -- session-level checks ---------------------------------------------------------------------
    def check_fixed_paths(self) -> list[str]:
        """Lines describing fixed paths changed since the lock (empty when intact or deliberate): the run's one
        comparison with the lock (``golden/fixed_paths.py``), made here when this hook comes first. A project
        that asks for no lock is judged against one too: an experiment's verdict needs its fixed paths."""
        from pytest_ditgate.golden.fixed_paths import lock_state

        state = lock_state(self.config)
        if state is None or state.deliberate:
            return []
        verdict = state.evaluate()
        return list(verdict.lines()) if verdict.changed else []

    # -- decision ---------------------------------------------------------------------------------
    def build_record(self, session: pytest.Session) -> tuple[Any, dict[str, Any]]:
        """Pure: the advisory verdict and its record from what was collected (nothing is written), decided by
        ``verdict.evaluate`` as the judge decides."""
        from pytest_ditgate.verdict.candidate import declared_class
        from pytest_ditgate.verdict.evaluate import Evidence, evaluate
        from pytest_ditgate.verdict.outcome import Category, GateOutcome

        declared = declared_class(self.config)
        problems = list(self.session_problems)
        best = None
        try:
            best = self.recorded_best()
        except ValueError as exc:
            problems.append((Category.INTEGRITY, str(exc)))
        outcomes = dict(self.book.outcomes)
        if session.exitstatus in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.INTERNAL_ERROR):
            outcomes["<session>"] = GateOutcome("<session>", "error", None, "the run was interrupted")
        evaluation = evaluate(Evidence(
            outcomes=outcomes.values(), comparisons=self.comparisons, declared_class=declared,
            class_evidence=self.class_evidence, lane=self.lane, best=best, min_improvement=self.min_improvement,
            problems=problems, require_a_test=True))
        verdict = evaluation.verdict
        detail = {
            "time_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "advisory": True,
            "verdict": verdict.to_dict(),
            "classification": {"declared": declared, "effective": evaluation.effective_class,
                               "evidence": list(evaluation.class_evidence)},
            "comparisons": self.comparisons, "quality": self.quality, "best_before": best,
            "candidate_config": self.candidate_config or None,
            "peak_memory_bytes": self.peak_memory, "description": self.description, "notes": self.notes,
        }
        return verdict, detail

    def finish(self, session: pytest.Session) -> None:
        self.verdict, detail = self.build_record(session)
        if self.lane:
            self.notes.append("advisory: only `ditgate experiment` records a lane's verdict, ledger row and best")
        if self.verdict_json:
            from pytest_ditgate.fsutil import atomic_write_json

            try:
                atomic_write_json(Path(self.verdict_json), detail)
            except OSError as exc:
                self.notes.append(f"could not write the verdict JSON {self.verdict_json}: {exc}")
                self.verdict_json_failed = True

    def recorded_best(self) -> dict[str, Any] | None:
        """The lane best this advisory verdict compares with: the last best ``ditgate experiment`` mirrored to
        ``<artefacts>/best/`` (read only here; a record of the wrong shape raises ``ValueError``, reported as
        an integrity problem). The judge itself reads the lane's history, never this mirror."""
        from pytest_ditgate.device import real_device
        from pytest_ditgate.verdict.ledger import load_best

        if not self.lane:
            return None
        arch = next((c["arch"] for c in self.comparisons if c.get("arch")), None) or real_device().arch
        return load_best(self.context.artefact_dir, self.lane, arch)

    # -- hooks (this object is registered as a plugin in experiment mode) ---------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Scope and integrity are judged before any test runs; a broken lock ends the run here, logged."""
        from pytest_ditgate.verdict.outcome import Category

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

    @pytest.hookimpl(trylast=True)  # after other plugins' sections: ditgate's summary is read last
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.verdict is None:
            return
        verdict = self.verdict
        terminalreporter.section("ditgate verdict", sep="=", bold=True,
                                 green=verdict.label == "keep", red=verdict.label != "keep")
        headline, *rest = verdict.lines()
        terminalreporter.write_line(headline, bold=True)
        for line in rest:
            terminalreporter.write_line(line)
        for note in self.notes:
            terminalreporter.write_line(f"note: {note}")


_session_key = pytest.StashKey[ExperimentSession]()


def check_verdict_json_path(path: Path, root: Path) -> None:
    """``--ditgate-verdict-json`` must name a file that can be written: a usage error before any test runs."""
    from pytest_ditgate.project_config import output_file_problem

    problem = output_file_problem(path, root, kind="JSON file")
    if problem is not None:
        raise pytest.UsageError(f"--ditgate-verdict-json={path}: {problem}")


def experiment(config: pytest.Config) -> ExperimentSession | None:
    """The run's experiment session (controller side), or None outside experiment mode."""
    return config.stash.get(_session_key, None)


def pytest_configure(config: pytest.Config) -> None:
    if get_context(config).is_xdist_worker:
        return
    from pytest_ditgate.judged_run import in_judged_run

    if in_judged_run():
        return  # the judge's child run: the judge decides, this process only carries evidence out
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
    """This process's peak CUDA memory so far (None when it never used CUDA; torch is never imported here).
    Never raises: a test may have patched ``torch.cuda`` to fail, and a report hook that raises would end
    the whole session (an xdist worker's INTERNALERROR) instead of reporting that one test."""
    import sys

    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized():
            return None
        return int(torch.cuda.max_memory_allocated())
    except Exception:  # noqa: BLE001 - a broken or patched CUDA runtime: no peak to report
        return None
