"""Workload fixtures of the DiT gate suite: the corpus, the baseline models and the contract comparator.

Every corpus case of a config becomes one test (``tiny_case`` / ``xl_case`` parameters). Outputs go
through ``golden.check`` with a comparator built on the quality contract (``quality_gate``), so a
candidate is judged on the contract's metrics against the ORIGINAL frozen baseline. ``dit_sampler``
is the hook point where an optimised implementation replaces the baseline's ``sample``.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

from dit_impl.corpus import CorpusCase, load_corpus, select
from dit_gate_support import WEIGHTS_SEED


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    for fixture, config, tag in (("tiny_case", "tiny", None), ("xl_case", "dit-xl-2-256", None),
                                 ("shapes_cpu_case", "dit-s-shapes", "cpu"), ("shapes_gpu_case", "dit-s-shapes", "gpu")):
        if fixture in metafunc.fixturenames:
            cases = select(load_corpus(), config=config, tag=tag)
            metafunc.parametrize(fixture, cases, ids=[c.name for c in cases])


@pytest.fixture(scope="session")
def dit_corpus() -> list[CorpusCase]:
    return load_corpus()


@pytest.fixture(scope="session")
def dit_sampler() -> Callable[..., Any]:
    """The implementation under test; the frozen baseline's ``sample`` until a candidate replaces it."""
    from dit_impl.baseline import sample

    return sample


@pytest.fixture(scope="session")
def tiny_model():
    from dit_impl.baseline import load_model

    return load_model("tiny", seed=WEIGHTS_SEED, dtype="float32", device="cpu")
