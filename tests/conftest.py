"""Shared helpers for the plugin's own tests (pytester based)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


#: the test files that take longest on two cores (measured), longest first: they run first, so that the short
#: files fill in around them (scripts/test hands whole files to its two xdist workers in collection order:
#: ``--dist loadfile --no-loadscope-reorder``); every other file keeps its place after them
LONGEST_FIRST = (
    "plugin/test_judge_timing.py",       # a timed baseline and ten judged runs, each timed by the judge
    "plugin/test_judge_runs.py",         # seven judged runs
    "plugin/test_judge_baseline.py",     # baselines of fresh projects (two runs each) and their failures
    "gates/dit/test_shapes.py",          # the shapes case sampled three times
    "dit_fast/test_lane_classes.py",     # seven pytest runs of the DiT lane's quality tests
    "plugin/test_bench_fixture.py",      # ditbench in pytest subprocesses, one with xdist workers
    "plugin/test_gpus_xdist.py",         # three pytest runs with xdist workers
    "plugin/test_tolerance_corpus.py",   # 57 honest variants, ten seeds each
    "plugin/test_agent_loop.py",         # the agent loop's judged runs
    "plugin/test_judge_classes.py",      # a baseline and two judged runs
    "gates/dit/test_candidate_lane.py",  # the candidate samples the shapes case
    "plugin/test_golden_store.py",       # one pytest run with xdist workers
    "kernels/test_sass_dtypes.py",       # nvcc builds
    "kernels/test_jit_lifecycle.py",     # nvcc builds
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files of :data:`LONGEST_FIRST` first (a stable sort: each file's tests keep their order)."""
    here = Path(__file__).resolve().parent
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def place(item: pytest.Item) -> int:
        try:
            return rank.get(Path(item.path).resolve().relative_to(here).as_posix(), len(rank))
        except ValueError:
            return len(rank)

    items.sort(key=place)


def pytest_configure(config: pytest.Config) -> None:
    """Import torch once up front where it is installed: pytester's in-process runs restore ``sys.modules``
    afterwards, and a torch first imported inside one run, then dropped, crashes on its next import. The same
    holds for torch._dynamo, which entering any dispatch mode imports (the gate's poisoning, its float64
    watch): dropped and imported again, it registers torch's test operators twice and raises."""
    try:
        import torch  # noqa: F401
        import torch._dynamo  # noqa: F401
    except ImportError:
        pass


@pytest.fixture(autouse=True)
def _no_profile_leak(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no device profile and a fresh device cache."""
    from pytest_ditgate import device

    monkeypatch.delenv("DITGATE_DEVICE_PROFILE", raising=False)
    # pytester subprocesses must not believe they are xdist workers of the outer run (pytest-benchmark
    # disables itself in xdist workers, for one)
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)
    device.clear_cache()
    yield
    device.clear_cache()


@pytest.fixture
def use_profile(monkeypatch: pytest.MonkeyPatch):
    """Select a device profile for in-process pytester runs."""
    from pytest_ditgate import device

    def select(name: str | None) -> None:
        if name is None:
            monkeypatch.delenv("DITGATE_DEVICE_PROFILE", raising=False)
        else:
            monkeypatch.setenv("DITGATE_DEVICE_PROFILE", name)
        device.clear_cache()

    return select


@pytest.fixture(scope="module")
def load_benchmark():
    """Import a script of ``benchmarks/`` by name; ``benchmarks/`` stays on ``sys.path`` for the test module
    (the scripts import their siblings, some lazily)."""
    sys.path.insert(0, str(BENCHMARKS))

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    try:
        yield load
    finally:
        sys.path.remove(str(BENCHMARKS))
