"""The child side of a judged run (``-p pytest_ditgate.experiment.child``, folder in ``$DITGATE_CHILD_OUT``;
the folder's names are ``judged_run.py``'s).

This plugin runs in the candidate's process, so nothing it writes is trusted for a KEEP on its own: it
only carries evidence out. It writes, into the fresh folder the judge made:

* ``outputs/<n>.safetensors`` + ``outputs.jsonl``: every tensor set passed to ``golden.check``
  (the judge compares them with the goldens itself);
* ``tests.jsonl``: each test's phases and outcomes (a failure here can only discard);
* ``class.json``: what executed (:mod:`observe`), plus what ``ditgate_candidate.declare`` reported;
* the timing samples land in ``artefacts/bench.jsonl`` through the bench ledger (the artefact folder
  of the child is inside the output folder).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

import pytest

from pytest_ditgate.judged_run import CLASS, JUDGE_TIMES_ENV, OUT_ENV, OUTPUTS, TESTS, TIMED_BY_JUDGE
from pytest_ditgate.report_properties import CLASS_EVIDENCE_PROPERTY, CONFIG_PROPERTY, REASON_PROPERTY


class ChildRecorder:
    def __init__(self, out: Path, project: Path | None = None) -> None:
        self.out = out
        #: the project's root: the observer scans its modules' globals too
        self.project = project
        self.count = 0
        self.evidence: Any = None
        self.observer: Any = None
        self.full_scan = True
        self.modules = 0
        self.declared: list[str] = []
        self.config: dict[str, Any] = {}

    # -- outputs ------------------------------------------------------------------------------------
    @pytest.hookimpl(wrapper=True)
    def pytest_ditgate_golden_check(self, name: str, key: str, tensors: Any, nodeid: str,
                                    optional: tuple[str, ...]) -> Iterator[Any]:
        """Every checked tensor set goes to the judge; the comparison (metrics, SSIM windows) is not the
        candidate's code, so the observer is off while it runs."""
        self.save_output(name, key, nodeid, tensors, optional)
        if self.observer is None:
            return (yield)
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes():
            return (yield)

    def save_output(self, name: str, key: str, nodeid: str, tensors: Any, optional: Any = ()) -> None:
        from safetensors.torch import save_file

        from pytest_ditgate.golden.serializer import plain_copies

        self.count += 1
        file = f"outputs/{self.count:04d}.safetensors"
        (self.out / "outputs").mkdir(parents=True, exist_ok=True)
        plain = plain_copies(tensors)  # tensors sharing memory are values too; safetensors refuses them
        save_file(plain, str(self.out / file))
        _append(self.out / OUTPUTS, {"name": name, "key": key, "test": nodeid, "file": file,
                                     "optional": [str(p) for p in optional],
                                     "tensors": {k: [str(v.dtype), list(v.shape)] for k, v in plain.items()}})

    # -- hooks --------------------------------------------------------------------------------------
    def pytest_ditgate_before_pair(self, candidate: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """``ditbench.pair`` times without the observer: the candidate is called once before, observed, untimed."""
        if self._start() is not None:
            try:
                candidate(*args, **kwargs)  # what the timed calls will run
            finally:
                self._stop()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
        items = getattr(item.session, "items", None) or [item]
        self.full_scan = self.evidence is None or item is items[-1]  # the first and the last test: every module
        if "ditbench" not in getattr(item, "funcargs", {}):  # a timed test is observed in pytest_ditgate_before_pair
            self._start()
        try:
            return (yield)
        finally:
            self._stop()

    def _start(self) -> Any:
        try:
            import torch  # noqa: F401

            from pytest_ditgate.experiment.observe import Evidence, make_observer, watch_modules
        except ImportError:
            return None
        if self.evidence is None:
            self.evidence = Evidence()
            self.evidence.project = self.project
            watch_modules(self.evidence)
        self.observer = make_observer(self.evidence)
        self.observer.__enter__()
        return self.observer

    def _stop(self) -> None:
        if self.observer is not None:
            self.observer.__exit__(None, None, None)
            self.observer = None
            from pytest_ditgate.experiment.observe import scan_modules

            self.modules = max(self.modules, scan_modules(self.evidence, full=self.full_scan))
            self.full_scan = False

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props = dict(report.user_properties) if report.when == "call" else {}
        for key, value in report.user_properties:
            if key == CLASS_EVIDENCE_PROPERTY and report.when == "call":
                self.declared.extend(str(v) for v in value)
            elif key == CONFIG_PROPERTY and report.when == "call":
                self.config.update(value)
        from pytest_ditgate.verdict.reports import failure_message

        message = failure_message(report) if report.failed else ""
        _append(self.out / TESTS, {"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
                                   "reason": dict(report.user_properties).get(REASON_PROPERTY) or props.get(REASON_PROPERTY),
                                   "message": message[:2000]})

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """Where the judge times the lane itself, a test that times in this process (``ditbench``) is left out:
        its numbers would not count, and its time would."""
        if os.environ.get(JUDGE_TIMES_ENV) != "1":
            return
        timing = [item for item in items if "ditbench" in getattr(item, "fixturenames", ())]
        if timing:
            kept = [item for item in items if item not in timing]
            config.hook.pytest_deselected(items=timing)
            items[:] = kept
        (self.out / TIMED_BY_JUDGE).write_text(json.dumps(sorted(item.nodeid for item in timing)))

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            _append(self.out / TESTS, {"nodeid": report.nodeid or "<collection>", "when": "collect",
                                       "outcome": "error", "message": str(report.longrepr)[-2000:]})

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        evidence = self.evidence
        if evidence is not None:  # what module-level caches still hold, every way it was built
            from pytest_ditgate.experiment.observe import scan_modules

            self.modules = max(self.modules, scan_modules(evidence, full=True))
        data = {"observed": evidence is not None, "modules": self.modules,
                "gemms": evidence.gemms if evidence else 0, "ops": evidence.ops if evidence else 0,
                "tf32_gemms": evidence.tf32_gemms if evidence else 0,
                "scan_s": round(evidence.scan_s, 3) if evidence else 0.0,
                "evidence": list(evidence.items) if evidence else [], "declared": self.declared,
                "candidate_config": self.config, "exitstatus": int(session.exitstatus),
                "collected": session.testscollected}
        (self.out / CLASS).write_text(json.dumps(data, sort_keys=True, default=str))


def _append(path: Path, record: dict[str, Any]) -> None:
    from pytest_ditgate.fsutil import append_jsonl

    append_jsonl(path, record)


def pytest_configure(config: pytest.Config) -> None:
    out = os.environ.get(OUT_ENV)
    if out and not hasattr(config, "workerinput"):
        recorder = ChildRecorder(Path(out), Path(str(config.rootpath)).resolve())
        config.pluginmanager.register(recorder, "ditgate-child-recorder")
