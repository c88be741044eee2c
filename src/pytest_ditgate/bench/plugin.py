"""The timing concern as a pytest plugin: the ``ditbench`` fixture, its options, the ledger, the terminal
summary and the bridge to pytest-benchmark.

Summary rows ride on each test's call report (``report.ditgate_bench``), so the xdist controller sees
the workers' measurements without reading files. Loading this module imports no torch.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import pytest

from pytest_ditgate.bench.ledger import LEDGER_FILE
from pytest_ditgate.bench.options import BUDGET, L2, LANE, MECHANISM, PROFILE
from pytest_ditgate.context import get_context
from pytest_ditgate.correctness.plugin import kernel_checks_key
from pytest_ditgate.options import get_option
from pytest_ditgate.report_properties import BENCH_ATTRIBUTE, COMPARISON_PROPERTY

DEFAULT_LANE = "default"


def _lane(config: pytest.Config) -> str:
    """The experiment lane (``--ditgate-lane``) the ledger files measurements and bests under."""
    return str(get_option(config, LANE) or DEFAULT_LANE)


#: per test item: summary rows of the measurements taken in it (moved onto the call report)
rows_key = pytest.StashKey["list[dict[str, Any]]"]()


reporter_key = pytest.StashKey["BenchReporter"]()


def pytest_configure(config: pytest.Config) -> None:
    # registered only with the gates on; timer_integrity remembers the stdlib clocks as they are when it is
    # first imported: import it now, before any test can patch them (stdlib only)
    import pytest_ditgate.timer_integrity  # noqa: F401

    reporter = BenchReporter(config)
    config.stash[reporter_key] = reporter
    config.pluginmanager.register(reporter, "ditgate-bench-reporter")


def pytest_unconfigure(config: pytest.Config) -> None:
    reporter = config.stash.get(reporter_key, None)
    if reporter is not None and config.pluginmanager.is_registered(reporter):
        config.pluginmanager.unregister(reporter)


def _warn_io(node: pytest.Item, what: str, exc: OSError) -> None:
    node.warn(pytest.PytestWarning(f"ditgate: could not write {what}: {exc}"))


def _benchmark_feeder(request: pytest.FixtureRequest) -> Callable[[Any], None] | None:
    """A callback that hands one Measurement to pytest-benchmark, or None when it is not in play."""
    config = request.config
    if not config.pluginmanager.has_plugin("pytest_benchmark.plugin") and not config.pluginmanager.has_plugin("benchmark"):
        return None
    if config.getoption("benchmark_skip", default=False) or config.getoption("benchmark_disable", default=False):
        return None
    if "benchmark" in request.fixturenames:  # the test drives pytest-benchmark itself
        return None

    def feed(m: Any, extra: dict[str, Any] | None = None) -> None:
        from pytest_ditgate.bench.pytest_benchmark_bridge import feed_measurement

        feed_measurement(request, m, extra)

    return feed


@pytest.fixture
def ditbench(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Measure with true device time and record: ``ditbench(fn, *args, **opts) -> Measurement``;
    ``ditbench.pair(candidate, reference, *args, min_speedup=0.05)`` gates a speed claim."""
    from pytest_ditgate.bench.fixture import DitBench
    from pytest_ditgate.bench.ledger import Ledger
    from pytest_ditgate.bench.report import comparison_row, measurement_row, profile_row

    config = request.config
    context = get_context(config)
    ledger = Ledger(context.artefact_dir / LEDGER_FILE)
    lane = _lane(config)
    node = request.node
    test = node.nodeid
    rows = node.stash.setdefault(rows_key, [])

    def record_measurement(m: Any, profiles: list[dict[str, Any]]) -> None:
        rows.append(measurement_row(test, m))
        rows.extend(profile_row(test, p) for p in profiles)
        try:
            ledger.record_measurement(m, test=test, lane=lane, profiles=profiles)
        except OSError as exc:
            _warn_io(node, LEDGER_FILE, exc)

    def record_comparison(c: Any, min_speedup: float, passed: bool, profiles: list[dict[str, Any]]) -> None:
        row = comparison_row(test, c, min_speedup, passed)
        rows.append(row)
        rows.extend(profile_row(test, p) for p in profiles)
        node.user_properties.append((COMPARISON_PROPERTY, row))
        try:
            ledger.record_comparison(c, test=test, lane=lane, min_speedup=min_speedup, passed=passed,
                                     profiles=profiles)
        except OSError as exc:
            _warn_io(node, LEDGER_FILE, exc)

    def profiler(call: Any, label: str, timed_ms: float, eager: Any = None) -> dict[str, Any]:
        from pytest_ditgate.bench.tracing import profile_call

        return profile_call(call, label=label, artefact_dir=context.artefact_dir, test=test,
                            timed_ms=timed_ms, eager=eager).to_dict()

    def best(m: Any) -> dict[str, Any] | None:
        return ledger.best(test=test, arch=m.arch, lane=lane, driver=m.driver, torch=m.torch)

    defaults: dict[str, Any] = {"mechanism": get_option(config, MECHANISM), "l2": get_option(config, L2)}
    budget = get_option(config, BUDGET)
    if budget is not None:
        defaults["budget_ms"] = budget
    yield DitBench(
        test=test,
        lane=lane,
        record_measurement=record_measurement,
        record_comparison=record_comparison,
        checks=lambda: list(node.stash.get(kernel_checks_key, [])),
        best=best,
        feed=_benchmark_feeder(request),
        defaults=defaults,
        profile=bool(get_option(config, PROFILE)),
        profiler=profiler,
        hook=config.hook,
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Put the item's summary rows on its call report (plain dicts: serialised to the xdist controller)."""
    report = yield
    if call.when == "call":
        rows = item.stash.get(rows_key, None)
        if rows:
            setattr(report, BENCH_ATTRIBUTE, list(rows))
    return report


class BenchReporter:
    """Per-config collector: gathers rows from call reports (workers' too) and prints the summary."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.rows: list[dict[str, Any]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        rows = getattr(report, BENCH_ATTRIBUTE, None)
        if rows and report.when == "call":
            self.rows.extend(rows)

    @pytest.hookimpl(trylast=True)  # after other plugins' sections: ditgate's summary is read last
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        from pytest_ditgate.bench.report import summary_lines

        lines = summary_lines(self.rows)
        if not lines:
            return
        terminalreporter.write_sep("=", "ditgate benchmarks")
        for line in lines:
            terminalreporter.write_line(line)
        artefacts = get_context(self.config).artefact_dir
        terminalreporter.write_line(f"ledger: {artefacts / LEDGER_FILE}")
        if any(r.get("kind") == "profile" for r in self.rows):
            from pytest_ditgate.bench.profiling import PROFILE_DIR

            terminalreporter.write_line(f"phase profiles: Chrome/Perfetto traces under {artefacts / PROFILE_DIR}/ "
                                        "(open in https://ui.perfetto.dev or chrome://tracing)")

    @pytest.hookimpl(optionalhook=True)
    def pytest_benchmark_update_machine_info(self, config: pytest.Config, machine_info: dict[str, Any]) -> None:
        """GPU provenance next to pytest-benchmark's CPU fields (only when something was measured on a GPU)."""
        gpu = next((r for r in self.rows if r.get("kind") == "measurement" and r.get("arch") != "cpu"), None)
        if gpu is not None:
            from pytest_ditgate.device import real_device

            device = real_device()
            machine_info["ditgate_gpu"] = {"name": device.name, "arch": device.arch, "driver": device.driver,
                                           "cuda": device.cuda_runtime, "torch": device.torch}
