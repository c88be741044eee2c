"""Reading test reports into gate outcomes: one rule for an advisory run (pytest's reports, in process) and the
judge (the reports its child wrote as JSON lines).

A test's phases arrive one by one: a skip in any phase stands unless a phase failed; a failure of the call, or
of any phase that carries a gate's reason code, is a gate failure (``failed``), any other failed phase (a setup
or teardown error) an ``error``; a passed call is ``passed`` unless a later phase failed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from pytest_ditgate.verdict.outcome import GateOutcome

#: the prefix a ``GateFailure`` puts before its message in a crash line
_GATE_PREFIX = re.compile(r"^[\w.]*GateFailure: \[[\w-]+\] ")


def failure_message(report: Any) -> str:
    """The one line that says why a pytest report failed (the crash line, else the last line of its text),
    without the ``GateFailure: [reason]`` prefix (the reason travels apart)."""
    crash = getattr(report.longrepr, "reprcrash", None)
    message = crash.message if crash is not None else (report.longreprtext.strip().splitlines() or [""])[-1]
    return _GATE_PREFIX.sub("", message)


@dataclass
class OutcomeBook:
    """The gate outcome of every test, built phase by phase, and the tests whose call ran."""

    outcomes: dict[str, GateOutcome] = field(default_factory=dict)
    ran: set[str] = field(default_factory=set)

    def add(self, nodeid: str, when: str | None, outcome: str | None, reason: str | None = None,
            message: str = "") -> None:
        """One phase's result (``outcome``: pytest's ``passed`` / ``failed`` / ``skipped``, or ``error`` for a
        collection error)."""
        if when == "call" and outcome in ("passed", "failed"):
            self.ran.add(nodeid)
        if outcome == "skipped" and nodeid not in self.outcomes:
            self.outcomes[nodeid] = GateOutcome(nodeid, "skipped")
        elif outcome in ("failed", "error"):
            kind = "failed" if when == "call" or reason else "error"
            self.outcomes[nodeid] = GateOutcome(nodeid, kind, reason, message)
        elif outcome == "passed" and when == "call":
            self.outcomes.setdefault(nodeid, GateOutcome(nodeid, "passed"))

    def add_report(self, report: Any, reason: str | None) -> None:
        """A pytest ``TestReport`` (its gate reason code read by the caller from its properties)."""
        self.add(report.nodeid, report.when, report.outcome, reason,
                 failure_message(report) if report.failed else "")
