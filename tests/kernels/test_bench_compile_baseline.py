"""kernels_bench's torch.compile baseline on the host: it runs compiled code, survives the state that made the
H200's compile column equal eager, and flags a baseline that is not in effect.

The H200 (torch 2.11) state is recreated by marking the reference's code object SKIP, which is what dynamo
did there after ``check_kernel`` called the compiled reference under its poisoning dispatch mode.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("kernels_bench")


def _inputs(seed: int, shapes=((2, 4, 32), (2, 32), (2, 32))):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=g) for shape in shapes)


def _residual_inputs(seed: int):
    return _inputs(seed, ((2, 4, 32), (2, 32), (2, 4, 32)))  # x, gate, y


def _mark_skip(code) -> None:
    eval_frame = pytest.importorskip("torch._C._dynamo.eval_frame")
    if not hasattr(eval_frame, "set_code_exec_strategy"):
        pytest.skip("this torch cannot set a code object's dynamo strategy")
    from torch._dynamo.types import FrameAction, FrameExecStrategy

    eval_frame.set_code_exec_strategy(code, FrameExecStrategy(FrameAction.SKIP, FrameAction.DEFAULT))


def test_compiled_baseline_runs_compiled_code_even_when_the_reference_code_is_marked_skip(bench) -> None:
    from kernels import reference as ref

    torch._dynamo.reset()
    try:
        _mark_skip(ref.layernorm_modulate_ref.__code__)
        naive_runs = {"graph_calls": 0, "graphs": 0}
        naive = torch.compile(ref.layernorm_modulate_ref, dynamic=False,
                              backend=bench.counting_backend(naive_runs, "eager"))
        naive(*_inputs(0))
        assert naive_runs == {"graph_calls": 0, "graphs": 0}  # the H200 failure: silently eager

        fn, runs = bench.compile_baseline(ref.layernorm_modulate_ref, "eager")
        out = fn(*_inputs(1))
        fn(*_inputs(2))
        assert runs == {"graph_calls": 2, "graphs": 1}
        torch.testing.assert_close(out, ref.layernorm_modulate_ref(*_inputs(1)))
    finally:
        torch._dynamo.reset()


def test_both_checks_exercise_the_compiled_graph(bench) -> None:
    """The poisoning dispatch mode ignores compile internals, so even the poisoned check runs compiled code."""
    from kernels import reference as ref

    fn, runs = bench.compile_baseline(ref.gated_residual_ref, "eager")
    try:
        fn(*_residual_inputs(0))
        before = runs["graph_calls"]
        bench.check(fn, ref.gated_residual_ref, _residual_inputs, "poisoned")
        after_poisoned = runs["graph_calls"]
        assert after_poisoned > before
        bench.check(fn, ref.gated_residual_ref, _residual_inputs, "plain", poison_memory=False)
        assert runs["graph_calls"] > after_poisoned
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("entry, expected", [
    ({"compile_graph_calls_timed": 40, "compile": {"median_ms": 1.0}, "eager": {"median_ms": 2.0}}, []),
    ({"compile_graph_calls_timed": 0, "compile": {"median_ms": 1.0}, "eager": {"median_ms": 2.0}},
     ["the compiled graph did not run while compile was timed (eager fallback)"]),
    ({"compile_graph_calls_timed": 40, "compile": {"median_ms": 2.219}, "eager": {"median_ms": 2.2139}},
     ["compile within 1% of eager"]),
])
def test_compile_verdict_flags_a_baseline_not_in_effect(bench, entry, expected) -> None:
    assert bench.compile_verdict(entry) == expected
