"""pytest wiring of the golden store: options, the ``golden`` fixture, queued writes and the summary.

``--ditgate-freeze`` writes goldens that are missing for the current device key; ``--ditgate-refreeze``
overwrites (and says so loudly); a normal ``--ditgate`` run never writes and fails a test whose golden
is missing. What a test froze is written when that test ends, and a golden that cannot be written errors
that test. Under pytest-xdist each worker writes its own (merged into the manifest under a file lock) and
reports its usage to the controller, which lists orphans.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_ditgate import options
from pytest_ditgate.context import get_context
from pytest_ditgate.golden.options import FREEZE, GOLDEN_DIR, REFREEZE
from pytest_ditgate.project_config import project_path

WORKER_OUTPUT = "ditgate_golden"


@dataclass
class GoldenPluginState:
    """The session plus what this process saw (collected and ran nodeids), and usage merged from workers."""

    session: Any  # GoldenSession
    rootdir: Path
    collected: set[str] = field(default_factory=set)
    ran: set[str] = field(default_factory=set)
    worker_usage: list[dict[str, Any]] = field(default_factory=list)
    report: Any = None  # GoldenReport, after sessionfinish


#: the run's golden-store session, built in ``pytest_configure``
golden_session_key = pytest.StashKey[GoldenPluginState]()


def golden_dir(config: pytest.Config, mode: str = "check") -> Path:
    """The golden store folder. One named by ``--ditgate-golden-dir`` must exist unless goldens are being
    frozen (a typo'd folder would otherwise fail every golden test as missing, asking to freeze there);
    freezing creates it inside the project or in an existing folder. The default ``<rootdir>/golden`` may
    be missing (a project without goldens)."""
    from pytest_ditgate.project_config import missing_folder_problem

    raw = options.get_option(config, GOLDEN_DIR)
    path = project_path(config.rootpath, raw) if raw else Path(config.rootpath) / "golden"
    from pytest_ditgate.judged_run import in_judged_run

    if raw and in_judged_run() and path.resolve() != (Path(config.rootpath) / "golden").resolve():
        raise pytest.UsageError(f"--ditgate-golden-dir / ini ditgate_golden_dir = {raw}: the judge (ditgate baseline "
                                "and experiment) reads and locks the golden store at golden/ only; remove the "
                                "setting (from addopts or the ini file) to judge a lane")
    if path.exists() and not path.is_dir():
        raise pytest.UsageError(f"--ditgate-golden-dir={raw}: {path} is a file, not a folder (the golden store "
                                "holds manifest.json and <device key>/*.safetensors)")
    if raw and not path.exists():
        if mode == "check":
            raise pytest.UsageError(f"--ditgate-golden-dir={raw}: no such folder {path}; a run that checks goldens "
                                    "reads them from an existing golden store (check the path; a new store is "
                                    "made with --ditgate-freeze)")
        problem = missing_folder_problem(path, config.rootpath)
        if problem is not None:
            raise pytest.UsageError(f"--ditgate-golden-dir={raw}: {problem}")
    return path


def golden_mode(config: pytest.Config) -> str:
    """``check``, ``freeze`` or ``refreeze``; contradictory flags are a usage error (gate-less ones are
    refused by ``plugin.py``: this module is registered only under ``--ditgate``)."""
    freeze, refreeze = bool(options.get_option(config, FREEZE)), bool(options.get_option(config, REFREEZE))
    if freeze and refreeze:
        raise pytest.UsageError("--ditgate-freeze and --ditgate-refreeze exclude each other: "
                                "freeze writes only missing goldens, refreeze overwrites all")
    return "refreeze" if refreeze else "freeze" if freeze else "check"


def _provenance_factory(config: pytest.Config):
    cache: dict[str, Any] = {}

    def provenance() -> dict[str, Any]:
        if not cache:
            from pytest_ditgate.device import real_device
            from pytest_ditgate.git import commit_id
            from pytest_ditgate.toolchain import package_version

            device = real_device()
            cache.update(
                torch=package_version("torch"), diffusers=package_version("diffusers"),
                commit=commit_id(config.rootpath),
                command="pytest " + " ".join(config.invocation_params.args),
                device={k: getattr(device, k) for k in ("name", "arch", "driver", "cuda_runtime")},
            )
        return dict(cache)

    return provenance


def pytest_configure(config: pytest.Config) -> None:
    mode = golden_mode(config)
    from pytest_ditgate.golden.session import GoldenSession
    from pytest_ditgate.golden.store import GoldenStore

    session = GoldenSession(GoldenStore(golden_dir(config, mode)), mode=mode, provenance=_provenance_factory(config))
    config.stash[golden_session_key] = GoldenPluginState(session, Path(config.rootpath))
    if mode != "check":  # before any test of any worker writes: a conflict then always meets at the flush
        session.snapshot()
    if mode == "refreeze" and not get_context(config).is_xdist_worker:
        config.issue_config_time_warning(pytest.PytestWarning(
            f"ditgate: --ditgate-refreeze will OVERWRITE existing goldens in {session.store.root}"), stacklevel=2)


def _state(config: pytest.Config) -> GoldenPluginState | None:
    return config.stash.get(golden_session_key, None)


def pytest_collection_finish(session: pytest.Session) -> None:
    state = _state(session.config)
    if state is not None:
        state.collected.update(item.nodeid for item in session.items)


def pytest_deselected(items: list[pytest.Item]) -> None:
    if items:
        state = _state(items[0].config)
        if state is not None:
            state.collected.update(item.nodeid for item in items)


def pytest_runtest_call(item: pytest.Item) -> None:
    """A test that reaches its call phase ran (a skipped one did not): its goldens may be judged orphans."""
    state = _state(item.config)
    if state is not None:
        state.ran.add(item.nodeid)


@pytest.fixture
def golden(request: pytest.FixtureRequest):
    """Golden-store access for this test: ``golden.check(name, tensors)`` and ``golden.load(name)``. Under
    ``--ditgate-freeze``/``--ditgate-refreeze`` what the test froze is written when it ends; a golden that
    could not be written (another worker froze another value first, a read-only store) errors this test in
    its teardown (``golden_not_written``), so that every report of the run, JUnit's too, names it."""
    __tracebackhide__ = True
    from pytest_ditgate.golden.fixture import Golden

    session = request.config.stash[golden_session_key].session
    yield Golden(session, request.node.nodeid, hook=request.config.hook)
    errors = session.flush()
    if errors:
        from pytest_ditgate.errors import GateFailure

        raise GateFailure("golden_not_written", "\n  ".join(errors))


@pytest.hookimpl(trylast=True)
def pytest_ditgate_golden_check(check: Any) -> Any:
    """The comparison itself (wrappers around it see the tensors first)."""
    __tracebackhide__ = True
    return check()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Flush writes still queued (a failed write fails the run); workers hand usage to the controller."""
    config = session.config
    state = _state(config)
    if state is None:
        return
    golden_session = state.session
    golden_session.finish()
    if golden_session.write_errors:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    usage = {"used": sorted(golden_session.used), "ran": sorted(state.ran), "collected": sorted(state.collected),
             "written": golden_session.written, "overwritten": golden_session.overwritten,
             "fallbacks": [list(f) for f in golden_session.fallbacks], "errors": golden_session.write_errors,
             "not_compared": [[nodeid, name, list(names)] for nodeid, name, names in golden_session.not_compared]}
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput[WORKER_OUTPUT] = usage
        return
    state.report = build_report(state, [usage, *state.worker_usage])
    if state.report.errors and session.exitstatus == pytest.ExitCode.OK:
        # a worker's failed or refused write (two tests freezing one name with different values, on two
        # workers) fails the run: the controller's exit status is not the workers'
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def build_report(state: GoldenPluginState, usages: list[dict[str, Any]]):
    from pytest_ditgate.golden.manifest import ManifestError
    from pytest_ditgate.golden.report import GoldenReport, RunUsage, find_orphans

    merged: dict[str, list[Any]] = {k: [] for k in ("used", "ran", "collected", "written", "overwritten", "fallbacks",
                                                    "errors", "not_compared")}
    for usage in usages:
        for name in merged:
            merged[name].extend(usage.get(name, []))
    report = GoldenReport(state.session.mode, written=sorted(merged["written"]), overwritten=sorted(merged["overwritten"]),
                          fallbacks=[tuple(f) for f in merged["fallbacks"]], errors=list(merged["errors"]),
                          not_compared=[(n, name, tuple(t)) for n, name, t in merged["not_compared"]])
    store = state.session.store
    try:
        manifest = store.load_manifest()
    except ManifestError as exc:
        report.errors.append(str(exc))
        return report
    run = RunUsage(frozenset(merged["used"]), frozenset(merged["ran"]), frozenset(merged["collected"]))
    if run.ran:
        report.orphans = find_orphans(manifest, run, state.rootdir)
    report.untracked = store.untracked_files(manifest)
    return report


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist controller: collect each worker's golden usage."""
    usage = getattr(node, "workeroutput", {}).get(WORKER_OUTPUT)
    state = _state(node.config)
    if usage is not None and state is not None:
        state.worker_usage.append(usage)


@pytest.hookimpl(trylast=True)  # after other plugins' sections: ditgate's summary is read last
def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    state = _state(config)
    report = state.report if state is not None else None
    lines = report.lines() if report is not None else []
    if not lines:
        return
    terminalreporter.section("ditgate golden store", sep="-")
    for text, markup in lines:
        terminalreporter.write_line(text, **markup)
