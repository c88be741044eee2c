"""ditbench.pair against candidates that are honest while checked and cheat while timed (the red team's D1-D9):
each fails with its own reason, and torch and the clocks are put back afterwards.

Every run goes through ``runpytest_subprocess`` (see test_bench_fixture.py: in-process runs of ditbench crashed
CPython here). One suite per run keeps torch's import to one per run.
"""

from __future__ import annotations

import pytest

from host_only import no_cuda  # noqa: F401 - a fixture: the suites below time host code, as on a CPU machine

RUN = ("--ditgate", "--ditgate-bench-budget-ms=40", "-p", "no:benchmark", "-p", "no:cacheprovider", "-p",
       "no:randomly")

#: candidates whose timed calls return something else than they returned when checked
OUTPUT_CHEATS = """
import threading, queue, time
import torch

X, W = torch.randn(128, 128), torch.randn(128, 128)
PRE = X @ W


def reference(x, w):
    return x @ w


def honest_once():
    seen = [0]
    def candidate(x, w):
        seen[0] += 1
        return x @ w if seen[0] == 1 else torch.zeros(128, 128)
    return candidate


def first_forever():
    kept = []
    def candidate(x, w):
        if len(kept) < 3:  # honest through the agreement check (its precision probe sees a constant output)
            kept.insert(0, x @ w)
        return kept[0]
    return candidate


def by_identity():
    cache = {}
    def candidate(x, w):
        key = (id(x), id(w))
        if key not in cache:
            cache[key] = x @ w
        return cache[key]
    return candidate


def by_pointer():
    cache = {}
    def candidate(x, w):
        key = (x.data_ptr(), w.data_ptr())
        if key not in cache:
            cache[key] = x @ w
        return cache[key]
    return candidate


def test_zeros_after_the_check(ditbench):
    ditbench.pair(honest_once(), reference, X, W, min_speedup=None)


def test_the_first_result_forever(ditbench):
    ditbench.pair(first_forever(), reference, X, W, min_speedup=None)


# a cache that hits returns a stale output (output_audit); one that misses does the work (too_slow): never a pass
def test_cache_by_identity(ditbench):
    ditbench.pair(by_identity(), reference, X, W, min_speedup=0.3)


def test_cache_by_pointer(ditbench):
    ditbench.pair(by_pointer(), reference, X, W, min_speedup=0.3)


def test_precomputed_for_the_checked_tensor_is_never_served(ditbench):
    served = [0]
    def candidate(x, w):
        if x is X:
            served[0] += 1
            return PRE
        return x @ w
    c = ditbench.pair(candidate, reference, X, W, min_speedup=None)
    assert served[0] <= 1  # the agreement check's call at most: no timed call got X itself
    assert c.ratio > 0.5, c.describe()  # the real work was timed, not a 50x shortcut


_work = queue.Queue()


def _worker():
    while True:
        x, w, out = _work.get()
        time.sleep(0.002)  # longer than the harness's copy after the return takes, on a loaded machine too
        torch.matmul(x, w, out=out)
        _work.task_done()


threading.Thread(target=_worker, daemon=True).start()


def test_worker_thread_still_writing(ditbench):
    seen = [0]
    def candidate(x, w):
        seen[0] += 1
        out = torch.empty(128, 128)
        if seen[0] == 1:
            return torch.matmul(x, w, out=out)
        _work.put((x, w, out))
        return out
    try:
        ditbench.pair(candidate, reference, X, W, min_speedup=None)
    finally:
        _work.join()
"""


@pytest.mark.usefixtures("no_cuda")
def test_a_timed_call_that_returns_another_output_than_when_checked_fails(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_cheats=OUTPUT_CHEATS)
    result = pytester.runpytest_subprocess(*RUN)
    result.assert_outcomes(failed=5, passed=1)
    text = result.stdout.str()
    for test in ("zeros_after_the_check", "the_first_result_forever"):
        result.stdout.fnmatch_lines([f"FAILED test_cheats.py::test_{test} - [[]output_audit[]]*"])
    for test in ("cache_by_identity", "cache_by_pointer"):
        assert f"FAILED test_cheats.py::test_{test} - [output_audit]" in text or \
            f"FAILED test_cheats.py::test_{test} - [too_slow]" in text
    result.stdout.fnmatch_lines(["*[[]output_audit[]] ditbench.pair: the candidate `*` computed the reference's output "
                                 "when checked before timing, but not in timed call * (one of * calls audited at random "
                                 "out of *, on that call's own inputs): [[]mismatch[]]*"])
    assert "FAILED test_cheats.py::test_worker_thread_still_writing - [stale_output]" in text or \
        "FAILED test_cheats.py::test_worker_thread_still_writing - [output_audit]" in text


#: candidates that change what both sides share: their inputs, torch, the clocks
SHARED_CHEATS = """
import time
import pytest
import torch
from pytest_ditgate.bench import timers

X, W = torch.randn(128, 128), torch.randn(128, 128)
REAL_MATMUL = torch.Tensor.__matmul__
REAL_CLOCK = time.perf_counter
THREADS = torch.get_num_threads()


def reference(x, w):
    return x @ w


def after_the_check(action):
    seen = [0]
    def candidate(x, w):
        seen[0] += 1
        if seen[0] == 6:  # the agreement check calls it twice; the warm-up's calls come next
            action()
        return torch.mm(x, w)
    return candidate


def test_zeroes_the_shared_input(ditbench):
    shared = torch.randn(128, 128)
    ditbench.pair(after_the_check(shared.zero_), reference, shared, W, min_speedup=None)


def test_writes_into_its_argument(ditbench):
    def candidate(x, w):
        out = x @ w
        x.add_(1.0)
        return out
    ditbench.pair(candidate, reference, X.clone(), W, min_speedup=None, verify=False)


def test_doubles_the_references_matmul(ditbench):
    def slow(a, b):
        REAL_MATMUL(a, b)
        return REAL_MATMUL(a, b)
    def sabotage():
        torch.Tensor.__matmul__ = slow
    ditbench.pair(after_the_check(sabotage), reference, X.clone(), W, min_speedup=None)


def test_torch_was_put_back():
    assert torch.Tensor.__matmul__ is REAL_MATMUL and "__matmul__" not in vars(torch.Tensor)


def test_changes_the_thread_count(ditbench):
    ditbench.pair(after_the_check(lambda: torch.set_num_threads(THREADS + 1)), reference, X.clone(), W,
                  min_speedup=None)


def test_raises_the_thread_count_for_its_own_calls_only(ditbench):
    def candidate(x, w):
        torch.set_num_threads(THREADS + 1)
        try:
            return x @ w
        finally:
            torch.set_num_threads(THREADS)
    ditbench.pair(candidate, reference, X.clone(), W, min_speedup=None)


def test_the_thread_count_was_put_back():
    assert torch.get_num_threads() == THREADS
    assert torch.set_num_threads is torch._C.set_num_threads and type(torch.set_num_threads).__name__ == \
        "builtin_function_or_method"  # the pair's recorder is gone


@pytest.mark.parametrize("owner, name", [(time, "perf_counter"), (timers, "CLOCK")], ids=["time", "timers"])
def test_replaces_a_clock_while_timed(ditbench, owner, name):
    real = getattr(owner, name)
    def patch():
        setattr(owner, name, lambda: REAL_CLOCK() * 0.5)
    try:
        ditbench.pair(after_the_check(patch), reference, X.clone(), W, min_speedup=None)
    finally:
        assert getattr(owner, name) is real  # put back by the pair
        setattr(owner, name, real)


def test_the_test_patched_the_clock_before_the_pair(ditbench, monkeypatch):
    monkeypatch.setattr(time, "perf_counter", lambda: REAL_CLOCK())
    ditbench.pair(reference, reference, X.clone(), W, min_speedup=-0.5)
"""


@pytest.mark.usefixtures("no_cuda")
def test_a_candidate_that_changes_what_both_sides_share_fails(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_shared=SHARED_CHEATS)
    result = pytester.runpytest_subprocess(*RUN)
    result.assert_outcomes(failed=8, passed=2)
    result.stdout.fnmatch_lines_random([
        "*[[]input_mutated[]] ditbench.pair: the pair's argument(s) arg0 changed while it ran (the timed functions "
        "are handed copies*",
        "*[[]input_mutated[]] ditbench.pair: the candidate `*` wrote into its argument(s) arg0 in timed call *",
        "*[[]torch_tampered[]] ditbench.pair: torch changed while the pair ran (seen *): torch.Tensor.__matmul__ "
        "replaced. Both sides run in one process*",
        "*[[]torch_tampered[]] ditbench.pair: torch changed while the pair ran (seen *): torch.get_num_threads() "
        "* -> *",
        "*[[]torch_tampered[]] ditbench.pair: torch changed while the pair ran (seen *): torch.set_num_threads(*) "
        "called; torch.set_num_threads(*) called. Both sides*",
        "*[[]timer_tampered[]] timing functions were replaced or wrapped while the calls were timed, so by the timed "
        "code: time.perf_counter (the clocks and the timing modules' names are put back*",
        "*[[]timer_tampered[]] timing functions were replaced or wrapped while the calls were timed, so by the timed "
        "code: pytest_ditgate.bench.timers.CLOCK (the clocks *",
        "*[[]timer_tampered[]] ditbench.pair: refusing to time: timing functions were already replaced before it ran "
        "anything (by the test or code it imported): time.perf_counter*",
    ])
    text = result.stdout.str()
    assert "does not compute what the reference computes" not in text  # a patched clock blames no candidate
    assert not (pytester.path / ".ditgate" / "bench.jsonl").exists()  # nothing recorded for any of them
