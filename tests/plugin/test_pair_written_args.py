"""ditbench.pair with functions that write their arguments: an output buffer (``gelu(x, out)``), an in-place
KV-cache append, a workspace, an in-place histogram. ``out_args``, ``inout_args`` and ``scratch_args`` mean what
they mean for check_kernel and never reach the functions; honest kernels pass, a kernel that does nothing (when
checked, or only while timed) fails with its reason, an undeclared write still fails ``input_mutated``, and two
functions that return None with nothing declared are a usage error instead of a silent "99 % faster".

The suites run through ``runpytest_subprocess`` (see test_bench_fixture.py), one suite per run; the parts below
them run in this process.
"""

from __future__ import annotations

import pytest

from host_only import no_cuda  # noqa: F401 - a fixture: the suites below time host code, as on a CPU machine

RUN = ("--ditgate", "--ditgate-bench-budget-ms=40", "-p", "no:benchmark", "-p", "no:cacheprovider", "-p",
       "no:randomly")

KERNELS = """
import math
import torch
import torch.nn.functional as F
from pytest_ditgate.correctness.inputs import make_tensor

X = make_tensor((256, 4096), "float32", seed=0)
CACHE = make_tensor((2, 8, 512, 64), "float32", seed=1)   # batch, heads, positions, head dim
NEW = make_tensor((2, 8, 4, 64), "float32", seed=2)       # four new tokens
POSITION = torch.tensor(100)


def gelu_into(x, out):              # the kernel under test: writes its result into out, returns nothing
    F.gelu(x, out=out)


def gelu_reference(x, out):
    out.copy_(0.5 * x * (1 + torch.erf(x / math.sqrt(2))))


def kv_append(cache, new, position):  # in place: the cache is read and updated
    cache.narrow(2, int(position), new.shape[2]).copy_(new)


def kv_reference(cache, new, position):
    cache[:, :, int(position):int(position) + new.shape[2]] = new
"""

HONEST = KERNELS + """

def test_an_output_buffer_gelu(ditbench):
    out = torch.zeros(256, 4096)
    c = ditbench.pair(gelu_into, gelu_reference, X, out, min_speedup=None, out_args=(1,))
    assert c.checks["outputs"] == "outputs agree" and c.checks["written"] == "out_args=(1,)", c.checks
    assert c.checks["audited_calls"] >= 1 and c.checks["inputs"].endswith("; out and scratch arguments poisoned")
    assert not out.any()  # the pair's own arguments are never written: every call had its own copies


def test_an_output_buffer_named_by_keyword(ditbench):
    ditbench.pair(gelu_into, gelu_reference, X, out=torch.empty(256, 4096), min_speedup=None, out_args=("out",))


def test_a_kv_cache_append_in_place(ditbench):
    cache = CACHE.clone()
    c = ditbench.pair(kv_append, kv_reference, cache, NEW, POSITION, min_speedup=None, inout_args=(0,))
    assert c.checks["written"] == "inout_args=(0,)" and torch.equal(cache, CACHE)


def test_the_declarations_never_reach_the_functions(ditbench):
    seen = []
    def recording(cache, new, position, **extra):
        seen.append(extra)
        kv_append(cache, new, position)
    ditbench.pair(recording, kv_reference, CACHE.clone(), NEW, POSITION, min_speedup=None, inout_args=(0,))
    assert len(seen) > 10 and all(extra == {} for extra in seen)


def test_every_call_starts_from_the_pairs_values(ditbench):
    # a histogram added into in place is not idempotent: a copy that carried an earlier call's counts would be
    # timed on other work, and fail the output audit against the reference on fresh copies
    hist = torch.zeros(1024, dtype=torch.int64)
    ids = torch.randint(0, 1024, (65536,), generator=torch.Generator().manual_seed(0))
    entry = []
    def histogram(hist, ids):
        entry.append(int(hist.sum()))
        hist.index_add_(0, ids, torch.ones_like(ids))
    def reference(hist, ids):
        hist += torch.bincount(ids, minlength=hist.numel())
    ditbench.pair(histogram, reference, hist, ids, min_speedup=None, inout_args=(0,))
    assert len(entry) > 10 and set(entry) == {0}


def test_a_workspace_is_neither_compared_nor_a_mutation(ditbench):
    def two_steps(x, out, workspace):  # the workspace holds the candidate's own intermediate, not the reference's
        torch.mul(x, 2.0, out=workspace)
        torch.mul(workspace, 0.5, out=out)
    def reference(x, out, workspace):
        out.copy_(x)
    c = ditbench.pair(two_steps, reference, X, torch.empty(256, 4096), torch.empty(256, 4096), min_speedup=None,
                      out_args=(1,), scratch_args=(2,))
    assert c.checks["written"] == "out_args=(1,), scratch_args=(2,)"
"""


@pytest.mark.usefixtures("no_cuda")
def test_honest_kernels_that_write_their_arguments_pass(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_honest=HONEST)
    result = pytester.runpytest_subprocess(*RUN)
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(["test_a_kv_cache_append_in_place: candidate / reference ratio *judged by the lane*"])
    assert "not compared" not in result.stdout.str()


CHEATS = KERNELS + """

def nothing(*args):
    pass


def test_an_output_buffer_left_unwritten(ditbench):
    ditbench.pair(nothing, gelu_reference, X, torch.empty(256, 4096), min_speedup=0.5, out_args=(1,))


def test_a_kv_append_that_appends_nothing(ditbench):
    ditbench.pair(nothing, kv_reference, CACHE.clone(), NEW, POSITION, min_speedup=0.5, inout_args=(0,))


def test_writes_its_output_buffer_only_when_checked(ditbench):
    calls = [0]
    def gelu_once(x, out):
        calls[0] += 1
        if calls[0] == 1:
            F.gelu(x, out=out)
    ditbench.pair(gelu_once, gelu_reference, X, torch.empty(256, 4096), min_speedup=None, out_args=(1,))


def test_writes_an_argument_it_does_not_declare(ditbench):
    def gelu_and_scale(x, out):
        F.gelu(x, out=out)
        x.mul_(0.5)
    ditbench.pair(gelu_and_scale, gelu_reference, X.clone(), torch.empty(256, 4096), min_speedup=None,
                  out_args=(1,))


def test_writes_an_argument_it_does_not_declare_unverified(ditbench):
    def kv_and_scale(cache, new, position):
        kv_append(cache, new, position)
        new.mul_(0.5)
    ditbench.pair(kv_and_scale, kv_reference, CACHE.clone(), NEW.clone(), POSITION, min_speedup=None,
                  inout_args=(0,), verify=False)


def test_both_return_none_and_nothing_is_declared(ditbench):
    ditbench.pair(nothing, gelu_reference, X, torch.empty(256, 4096), min_speedup=0.5)
"""


@pytest.mark.usefixtures("no_cuda")
def test_kernels_that_do_not_write_what_they_declare_fail_with_their_reason(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_cheats=CHEATS)
    result = pytester.runpytest_subprocess(*RUN)
    result.assert_outcomes(failed=6)
    before = "ditbench.pair: the candidate does not compute what the reference computes, so nothing was timed"
    result.stdout.fnmatch_lines_random([
        # checked before timing: the out buffer still holds the poison put there, the cache lacks the new tokens
        f"E   *[[]stale_output[]] {before}*: stale_output: out has elements the candidate never wrote*",
        f"E   *[[]mismatch[]] {before}*: mismatch: in-out arg0 differs from the reference beyond tolerance*",
        # honest when checked, a no-op while timed: its poisoned out copy is what the audited call produced
        "E   *[[]output_audit[]] ditbench.pair: the candidate `*gelu_once` computed the reference's output when "
        "checked before timing, but not in timed call * [[]stale_output[]] *out has elements the candidate never "
        "wrote*",
        "E   *[[]input_mutated[]] ditbench.pair: checked once against the reference before timing, a function wrote "
        "where it may not*the candidate modified its input arg0 (first call)*",
        "E   *a kernel that writes it declares it: out_args=(...)*",
        "E   *[[]input_mutated[]] ditbench.pair: the candidate `*kv_and_scale` wrote into its argument(s) arg1 in "
        "timed call *unless the pair declares the argument written: out_args=(...) for an output buffer, "
        "inout_args=(...) for an argument read and updated in place, scratch_args=(...) for a workspace (declared: "
        "inout_args=(0,)). Nothing was recorded.",
        "E   *DitgateUsageError: ditbench.pair: the candidate `nothing` and the reference `gelu_reference` both "
        "return None and no out_args or inout_args are declared, so the check before timing would compare nothing"
        "*The reference writes arg1: declare it, out_args=(1,) if the functions only write it, inout_args=(1,) if "
        "they read and update it in place (as for check_kernel); or pass verify=False for two functions not meant "
        "to agree.",
    ])
    assert not (pytester.path / ".ditgate" / "bench.jsonl").exists()  # nothing recorded for any of them


# -- the parts, in this process ---------------------------------------------------------------------------------


def test_fresh_copies_of_out_and_scratch_arguments_hold_poison_and_their_writes_are_expected() -> None:
    torch = pytest.importorskip("torch")
    import random

    from pytest_ditgate.bench.fresh_inputs import FreshInputs, layout_copy, same_bits

    x, out, cache = torch.randn(4, 8), torch.zeros(4, 8), torch.randn(2, 16)[:, 4:12]
    flags = torch.zeros(8, dtype=torch.bool)
    fresh = FreshInputs((x, out, cache), {"flags": flags}, writable=frozenset({"arg1", "arg2", "flags"}),
                        poisoned=frozenset({"arg1", "flags"}))
    changes = fresh.draw(random.Random(0))
    assert {c.leaf for c in changes} == {0, 2}  # out buffers are not perturbed: they hold no values to change
    args, kwargs = fresh.make(changes)
    assert args[1].isnan().all() and args[1].view(torch.int32).eq(-1).all()  # 0xFF bytes, as check_kernel's poison
    assert not kwargs["flags"].any()  # a bool buffer holds zeros
    assert (args[2].shape, args[2].stride()) == (cache.shape, cache.stride()) and args[2].ne(cache).sum() == 1
    args[1].zero_(), args[2].zero_(), kwargs["flags"].fill_(True)
    assert fresh.written(args, kwargs, changes) == []  # declared writes are the functions' own
    args[0].add_(1)
    assert fresh.written(args, kwargs, changes) == ["arg0"]
    copy = layout_copy(cache)
    assert same_bits(copy, cache) and copy.stride() == cache.stride() and copy.data_ptr() != cache.data_ptr()


def test_the_declarations_are_checked_before_anything_runs() -> None:
    torch = pytest.importorskip("torch")
    from pytest_ditgate.bench import measure_pair
    from pytest_ditgate.errors import DitgateUsageError

    calls = []
    def kernel(*args, **kwargs):
        calls.append(1)
    x, out = torch.randn(8), torch.empty(8)
    for declaration, message in [
            (dict(out_args=1), r"out_args must be a tuple of positional indices and keyword names .*got int 1"),
            (dict(out_args=(1,), inout_args=(1,)), "argument 1 is named in both out_args and inout_args"),
            (dict(out_args=(2,)), r"out_args names position 2, but the pair has 2 positional argument\(s\)"),
            (dict(inout_args=("cache",)), "inout_args names 'cache', which is none of the pair's keyword arguments"),
            (dict(scratch_args=(0,), args=(4, out)), r"scratch_args names arg0, which is not a tensor \(int\)"),
            (dict(out_args=(1,), args=(x, x)), "arg1 .out_args. is the same tensor as arg0")]:
        args = declaration.pop("args", (x, out))
        with pytest.raises(DitgateUsageError, match=message):
            measure_pair(kernel, kernel, *args, **declaration)
    assert calls == []


def test_measure_pair_times_an_in_place_kernel_on_copies() -> None:
    torch = pytest.importorskip("torch")
    from pytest_ditgate.bench import measure_pair
    from pytest_ditgate.bench.runner import MIN_PAIR_ROUNDS
    from pytest_ditgate.errors import GateFailure

    cache, new = torch.randn(2, 4, 64, 16), torch.randn(2, 4, 3, 16)
    kept = cache.clone()

    def append(cache, new):
        cache[:, :, 10:13] = new

    c = measure_pair(append, append, cache, new, rounds=MIN_PAIR_ROUNDS, warmup=1, mechanism="wall", inout_args=(0,))
    assert c.a.extra["audited_calls"] >= 1 and torch.equal(cache, kept)
    with pytest.raises(GateFailure, match=r"^\[input_mutated\] ditbench.pair: the candidate `.*append` wrote into its "
                                          r"argument\(s\) arg0 in .*unless the pair declares the argument written"):
        measure_pair(append, append, cache, new, rounds=MIN_PAIR_ROUNDS, warmup=1, mechanism="wall")
