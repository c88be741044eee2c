"""The parts of the pair's audits on their own: fresh copies of the arguments, torch's state, the timers' own
bindings, the fewest rounds a pair takes, and where the pair's record says what it compared."""

from __future__ import annotations

import random
import time

import pytest

torch = pytest.importorskip("torch")

from pytest_ditgate.bench import measure_pair  # noqa: E402
from pytest_ditgate.bench import timers  # noqa: E402
from pytest_ditgate.bench.comparison import Comparison  # noqa: E402
from pytest_ditgate.bench.fresh_inputs import FreshInputs, same_bits  # noqa: E402
from pytest_ditgate.bench.runner import MIN_PAIR_ROUNDS  # noqa: E402
from pytest_ditgate.bench.torch_state import TorchState  # noqa: E402
from pytest_ditgate.errors import DitgateUsageError  # noqa: E402
from pytest_ditgate.timer_integrity import bindings, changed_bindings, restore_timers, tampered_timers  # noqa: E402
from pytest_ditgate.verdict.outcome import REASON_CATEGORIES, Category  # noqa: E402


def test_fresh_copies_keep_the_layout_and_change_one_element_of_each_floating_argument() -> None:
    base = torch.randn(8, 40)
    view, transposed, broadcast = base[:, 3:35], base.t(), torch.randn(40).expand(8, 40)
    ids, weight = torch.arange(10), torch.nn.Parameter(torch.randn(4, 4))
    fresh = FreshInputs((view, transposed, broadcast, [ids, weight], 7), {"again": view})
    changes = fresh.draw(random.Random(0))
    args, kwargs = fresh.make(changes)
    for original, copy in zip((view, transposed, broadcast, ids, weight), (*args[:3], *args[3])):
        assert copy.data_ptr() != original.data_ptr() and type(copy) is type(original)
        assert (copy.shape, copy.stride(), copy.dtype) == (original.shape, original.stride(), original.dtype)
        assert copy.data_ptr() % 64 == original.data_ptr() % 64  # the same alignment: the same vector paths
    assert [not same_bits(c, o) for c, o in zip(args[:3], (view, transposed, broadcast))] == [True] * 3
    assert (args[3][0] == ids).all() and args[3][1].requires_grad  # integers as they are; a parameter stays one
    assert (copy := args[0]).ne(view).sum() == 1 and (copy / view).min() >= 0.125  # shrunk towards zero, once
    assert kwargs["again"] is args[0] and args[4] == 7  # one tensor passed twice stays one tensor
    assert fresh.written(args, kwargs, changes) == [] and fresh.mutated() == []
    args[0].add_(1)
    assert fresh.written(args, kwargs, changes) == ["arg0", "again"]
    base[0, 0] += 1  # the pair's own argument (reached through a global)
    assert fresh.mutated() == ["arg1"]  # base.t() holds it; the view starts at column 3
    exact = FreshInputs((view,), {}, perturb=False)
    assert same_bits(exact.make(exact.draw(random.Random(1)))[0][0], view)


def test_torch_state_names_what_a_call_replaced_and_puts_it_back() -> None:
    state = TorchState()
    real_matmul, real_gelu, threads = torch.Tensor.__matmul__, torch.nn.functional.gelu, torch.get_num_threads()
    try:
        torch.Tensor.__matmul__ = lambda a, b: real_matmul(a, b)
        torch.nn.functional.gelu = lambda x, approximate="none": real_gelu(x)
        torch.set_num_threads(threads + 1)
        assert state.changes() == ["torch.Tensor.__matmul__ replaced", "torch.nn.functional.gelu replaced",
                                   f"torch.get_num_threads() {threads} -> {threads + 1}"]
        state.restore()
        assert state.changes() == []
        assert "__matmul__" not in vars(torch.Tensor) and torch.nn.functional.gelu is real_gelu
        assert torch.get_num_threads() == threads
    finally:
        torch.nn.functional.gelu = real_gelu
        vars(torch.Tensor).get("__matmul__") and delattr(torch.Tensor, "__matmul__")
        torch.set_num_threads(threads)


def test_a_clock_bound_by_the_timers_is_a_timer_and_their_names_are_watched() -> None:
    real = timers.CLOCK
    before = bindings()
    assert tampered_timers() == [] and changed_bindings(before) == []
    try:
        timers.CLOCK = lambda: time.perf_counter() * 0.5
        timers.time = object()  # a name added to the module shadows the one its functions would look up
        assert tampered_timers() == ["pytest_ditgate.bench.timers.CLOCK"]
        assert changed_bindings(before) == ["pytest_ditgate.bench.timers.CLOCK", "pytest_ditgate.bench.timers.time"]
        restore_timers(before)
        assert timers.CLOCK is real and not hasattr(timers, "time") and tampered_timers() == []
    finally:
        timers.CLOCK = real
        vars(timers).pop("time", None)


def test_a_pair_takes_at_least_ten_rounds() -> None:
    calls = []
    with pytest.raises(DitgateUsageError, match=rf"rounds=2: a pair takes at least {MIN_PAIR_ROUNDS} rounds .*"
                                                 rf"write rounds={MIN_PAIR_ROUNDS} or more"):
        measure_pair(lambda: calls.append(1), lambda: calls.append(2), rounds=2)
    with pytest.raises(DitgateUsageError, match="perturb must be True or False, got str 'no'"):
        measure_pair(lambda: None, lambda: None, perturb="no")
    assert calls == []  # checked before anything ran


def test_the_record_says_what_was_compared() -> None:
    c = measure_pair(lambda x: x + 1, lambda x: 1 + x, torch.randn(16), rounds=MIN_PAIR_ROUNDS, warmup=1,
                     mechanism="wall")
    assert c.a.extra["audited_calls"] >= 1 and c.a.extra["inputs"].startswith("fresh copies, one element")
    assert c.check_text() == "" and "checks" not in c.to_dict()  # measure_pair compares no outputs itself
    marked = Comparison(**{**vars(c), "checks": {"outputs": "outputs are not tensors: not compared"}})
    assert marked.check_text() == "outputs are not tensors: not compared"
    assert Comparison.from_dict(marked.to_dict()).checks == marked.checks


def test_reason_categories() -> None:
    assert REASON_CATEGORIES["torch_tampered"] is Category.INTEGRITY
    assert REASON_CATEGORIES["output_audit"] is Category.QUALITY


def test_a_latency_batch_gets_distinct_copies_up_to_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU each call of a latency batch is timed back to back: every one gets its own copies (no identity or
    content repeats inside the batch), up to POOL_BYTES of them, then they are reused in turn."""
    from pytest_ditgate.bench import audit
    from pytest_ditgate.bench.timers import Call

    x = torch.randn(256)  # 1 KiB
    guard = audit.PairGuard([Call(torch.neg, (x,)), Call(torch.neg, (x,))])
    batch = guard.batch(0, 8)
    assert len({id(c.args[0]) for c in batch}) == 8 and len({c.changes for c in batch}) == 8
    monkeypatch.setattr(audit, "POOL_BYTES", 3 * 1024)
    batch = guard.batch(0, 8)
    assert len({id(c.args[0]) for c in batch}) == 3 and batch[3] is batch[0]


def test_a_buffer_both_sides_share_is_no_stale_output() -> None:
    """A CUDA graph's static output shared by both sides (or one function against itself): the reference's call
    overwrites the candidate's output before its round ends, which is no work left running."""
    out = torch.empty(64)

    def into_buffer(x):
        torch.mul(x, 2, out=out)
        return out

    c = measure_pair(into_buffer, into_buffer, torch.randn(64), rounds=MIN_PAIR_ROUNDS, warmup=1, mechanism="wall")
    assert c.a.extra["audited_calls"] >= 1


def test_a_timed_call_outside_the_references_domain_times_the_pair_again_on_exact_copies(monkeypatch) -> None:
    """Where the reference raises on a timed call's perturbed copies too, the pair is timed again on exact ones;
    where only the candidate raises, it is the candidate's crash."""
    from pytest_ditgate.bench import audit
    from pytest_ditgate.errors import GateFailure

    monkeypatch.setattr(audit, "PROBES", 0)  # no probe before the warm-up: the first perturbed call raises
    v = 1.5 + 0.5 * torch.rand(16)

    def factor(x):
        return torch.linalg.cholesky(torch.diag(x - 1))

    c = measure_pair(factor, factor, v, rounds=MIN_PAIR_ROUNDS, warmup=1, mechanism="wall")
    assert c.a.extra["inputs"] == ("fresh copies (exact: the reference raised _LinAlgError on perturbed copies a "
                                   "timed call had)")
    with pytest.raises(GateFailure, match=r"^\[crash\] the candidate `.*picky` raised ValueError while being timed"):
        def picky(x):
            if not torch.equal(x, v):
                raise ValueError("not the tensor I was checked on")
            return x * 2
        measure_pair(picky, lambda x: x * 2, v, rounds=MIN_PAIR_ROUNDS, warmup=1, mechanism="wall")
