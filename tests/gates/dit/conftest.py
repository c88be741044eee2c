"""Workload fixtures of the DiT gate suite: the corpus, the baseline models and the contract comparator.

Every corpus case of a config becomes one test (``tiny_case`` / ``xl_case`` parameters). Outputs go
through ``golden.check`` with a comparator built on the quality contract (``quality_gate``), so a
candidate is judged on the contract's metrics against the ORIGINAL frozen baseline. ``dit_sampler``
is the hook point where an optimised implementation replaces the baseline's ``sample``.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import pytest

from dit_impl.corpus import CorpusCase, load_corpus, select

#: random-weight seed of every model in this suite (goldens were frozen with it)
WEIGHTS_SEED = 0
#: XL/2 goldens keep activations of the first image and its first 64 tokens only (size budget)
XL_ACTIVATION_IMAGES, XL_ACTIVATION_TOKENS = 1, 64


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    for fixture, config in (("tiny_case", "tiny"), ("xl_case", "dit-xl-2-256")):
        if fixture in metafunc.fixturenames:
            cases = select(load_corpus(), config=config)
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


@contextlib.contextmanager
def full_fp32() -> Iterator[None]:
    """Disable TF32 in matmuls and convolutions, so a float32 reference is true float32 on the GPU."""
    import torch

    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def case_metadata(case: CorpusCase, info: dict[str, Any]) -> dict[str, Any]:
    """What a golden records about the run that made it (manifest provenance)."""
    return {"case": case.name, "weights_seed": WEIGHTS_SEED, **info}


def contract_compare(quality_gate: Any, case: str, *, experiment_class: str | None = None) -> Callable[[Any, Any], Any]:
    """A golden comparator that judges with the quality contract, widened by the fallback tolerance scale."""

    def compare(candidate: Any, hit: Any) -> Any:
        __tracebackhide__ = True
        return quality_gate.check(case, candidate, hit.tensors, tolerance_scale=hit.tolerance_scale,
                                  experiment_class=experiment_class)

    return compare
