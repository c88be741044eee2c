"""Hypothesis strategies for kernel inputs: awkward shapes, dtypes and memory layouts.

Importing this module imports hypothesis (a test dependency); nothing else in the plugin does. Typical
use with the gate::

    @given(spec=tensor_specs(dims=2, block=64))
    @settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
    def test_my_kernel(kernel_check, spec):
        kernel_check(my_kernel, reference, lambda seed: (spec.make(seed),), trials=2)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from hypothesis import strategies as st

from pytest_ditgate.correctness.inputs import LAYOUTS, make_tensor

FLOAT_DTYPES = ("float32", "float16", "bfloat16")


def sizes(*, max_side: int = 67, block: int | None = None) -> st.SearchStrategy[int]:
    """One dimension's size, biased to the edges: 1, small odd sizes, and block-1 / block / block+1."""
    edges = {e for e in (1, 2, 3, 5, 7, 13, 31, 33) if e <= max_side}
    if block:
        edges |= {e for e in (block - 1, block, block + 1, 2 * block + 1) if e >= 1}
    edges = sorted(edges)
    return st.one_of(st.sampled_from(edges), st.integers(1, max_side))


def shapes(*, dims: int | tuple[int, int] = (1, 4), max_side: int = 67, block: int | None = None,
           max_numel: int = 1 << 16) -> st.SearchStrategy[tuple[int, ...]]:
    """Shapes with ``dims`` dimensions (an int or an inclusive range), each from :func:`sizes`, whose
    element count stays under ``max_numel`` (so CPU tests stay fast)."""
    low, high = (dims, dims) if isinstance(dims, int) else dims
    return st.integers(low, high).flatmap(
        lambda n: st.tuples(*[sizes(max_side=max_side, block=block)] * n)
    ).filter(lambda shape: _numel(shape) <= max_numel)


def dtypes(names: Sequence[str] = FLOAT_DTYPES) -> st.SearchStrategy[Any]:
    """torch dtypes drawn from ``names`` (torch is imported when a value is drawn)."""
    def resolve(name: str) -> Any:
        import torch

        return getattr(torch, name)

    return st.sampled_from(tuple(names)).map(resolve)


def layouts(names: Sequence[str] = LAYOUTS) -> st.SearchStrategy[str]:
    """Memory layouts understood by :func:`~pytest_ditgate.correctness.inputs.make_tensor`."""
    return st.sampled_from(tuple(names))


@dataclass(frozen=True)
class TensorSpec:
    """A drawn shape, dtype and layout; :meth:`make` builds the tensor for one trial's seed."""

    shape: tuple[int, ...]
    dtype: Any
    layout: str

    def make(self, seed: int, device: Any = "cpu", **kwargs: Any) -> Any:
        return make_tensor(self.shape, self.dtype, seed=seed, layout=self.layout, device=device, **kwargs)


def tensor_specs(*, dims: int | tuple[int, int] = (1, 4), max_side: int = 67, block: int | None = None,
                 dtype_names: Sequence[str] = FLOAT_DTYPES, layout_names: Sequence[str] = LAYOUTS,
                 max_numel: int = 1 << 16) -> st.SearchStrategy[TensorSpec]:
    """Specs combining :func:`shapes`, :func:`dtypes` and :func:`layouts`."""
    return st.builds(TensorSpec, shape=shapes(dims=dims, max_side=max_side, block=block, max_numel=max_numel),
                     dtype=dtypes(dtype_names), layout=layouts(layout_names))


def tensors(*, device: Any = "cpu", **spec_kwargs: Any) -> st.SearchStrategy[Any]:
    """Ready tensors (seeded from a drawn integer) with drawn shape, dtype and layout."""
    return st.builds(lambda spec, seed: spec.make(seed, device), tensor_specs(**spec_kwargs),
                     st.integers(0, 2**31 - 1))


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for side in shape:
        count *= side
    return count
