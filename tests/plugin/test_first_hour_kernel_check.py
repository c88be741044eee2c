"""A new user's first hour with ``kernel_check`` (issue 37): no silent pass on a NaN reference, messages that
name types and shapes instead of printing values, usage errors before any user code runs, and an
exception of the user's own code reported as that code's, once, with its own frames."""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")

from pytest_ditgate import check_kernel  # noqa: E402
from pytest_ditgate.correctness.inputs import make_tensor  # noqa: E402
from pytest_ditgate.errors import DitgateUsageError, GateFailure  # noqa: E402


def _make(seed):
    return (make_tensor((8, 16), "float32", seed=seed),)


def _nan_everywhere(x):
    return torch.full_like(x, float("nan"))


# -- 1. a non-finite reference is never a pass --------------------------------------------------------

@pytest.mark.parametrize("candidate, reference, count", [
    (_nan_everywhere, _nan_everywhere, "128 of 128"),       # both NaN everywhere: used to pass (max abs err 0)
    (torch.log, torch.log, "61 of 128"),                   # log of signed inputs: NaN on half, candidate matches
    (lambda x: x * 2, _nan_everywhere, "128 of 128"),       # finite candidate: was "mismatch ... 1.8e+308 x"
])
def test_a_non_finite_reference_fails_naming_the_reference_and_the_first_index(candidate, reference, count) -> None:
    with pytest.raises(GateFailure) as excinfo:
        check_kernel(candidate, reference, _make, trials=2)
    failure = excinfo.value
    assert failure.reason == "reference_nonfinite" and failure.report.passed is False
    message = failure.message
    name = "torch.log" if reference is torch.log else reference.__name__
    assert f"the REFERENCE `{name}` returned NaN/Inf in out" in message
    assert f"{count} elements of the reference's out float64[8, 16] are non-finite" in message
    assert "first at index (0, 0): nan" in message and "seed 0" in message
    assert "mismatch" not in message.split("\n")[0] and "1.8e+308" not in message


def test_a_reference_finite_on_every_element_still_passes() -> None:
    report = check_kernel(torch.log, torch.log, lambda s: (make_tensor((8, 16), "float32", seed=s, low=0.5, high=2.0),))
    assert report.passed


# -- 2. messages name types and shapes, never a 342 KB value -------------------------------------------

def test_a_kernel_returning_a_python_list_fails_shape_with_a_short_message() -> None:
    make = lambda s: (make_tensor((512, 1024), "float32", seed=s),)  # noqa: E731 - a 512k-element list
    with pytest.raises(GateFailure) as excinfo:
        check_kernel(lambda x: (x * 2).tolist(), lambda x: x * 2, make, trials=1)
    failure = excinfo.value
    assert failure.reason == "shape"
    assert "the candidate returned list of 512 x list of 1024 x float" in failure.message
    assert "the reference returned torch.Tensor float64[512, 1024] on cpu" in failure.message
    assert "kernel_check compares torch tensors: out[0][0] is not one" in failure.message
    assert "returned T" not in failure.message and "'T'" not in failure.message
    assert len(str(failure)) < 2000 and max(len(line) for line in str(failure).splitlines()) < 400


def test_a_crash_message_is_clipped() -> None:
    def crashes(x):
        raise RuntimeError("x" * 100_000)

    with pytest.raises(GateFailure) as excinfo:
        check_kernel(crashes, lambda x: x, _make, trials=1)
    assert excinfo.value.reason == "crash" and "(100014 characters)" in excinfo.value.message
    assert len(str(excinfo.value)) < 2000


# -- 3./4. usage errors before any user code runs --------------------------------------------------------

def _two_args(x, w):
    return x * w


BAD_CALLS = [
    (dict(candidate="fused_rmsnorm"), "candidate must be a callable (the kernel under test*got str 'fused_rmsnorm'"),
    (dict(reference=torch.zeros(3)), "reference must be a callable*got torch.Tensor float32[[]3[]] on cpu"),
    (dict(make_inputs=[1, 2]), "make_inputs must be a callable (make_inputs(seed) returns*got list of 2 x int"),
    (dict(make_inputs=_two_args), "make_inputs is called with one argument, the seed, but _two_args(x, w) cannot be "
                                  "called with 1 argument(s)*check the order of the arguments*"),
    (dict(trials="5"), "trials must be an integer >= 1, got str '5'"),
    (dict(trials=0), "trials must be an integer >= 1, got int 0"),
    (dict(trials=True), "trials must be an integer >= 1, got bool True"),
    (dict(seed=1.5), "seed must be an integer, got float 1.5"),
    (dict(rtol=float("nan")), "rtol must be >= 0 (a finite number), got float nan"),
    (dict(atol="1e-3"), "atol must be >= 0 (a finite number), got str '1e-3'"),
    (dict(rel_norm=-1.0), "rel_norm must be >= 0 (a finite number), got float -1.0"),
    (dict(nondeterminism_atol=float("inf")), "nondeterminism_atol must be >= 0*got float inf"),
    (dict(out_args="out"), "out_args must be a tuple of positional indices and keyword names*got str 'out'"),
    (dict(check_determinism="no"), "check_determinism must be True or False, got str 'no'"),
    (dict(compute_dtype="fp12"), "no tolerance for dtype 'fp12'*"),
    (dict(label=3), "label must be a string, got int 3"),
]


@pytest.mark.parametrize("change, message", BAD_CALLS, ids=[next(iter(c)) + "=" + str(next(iter(c.values())))[:20]
                                                            for c, _ in BAD_CALLS])
def test_a_bad_argument_is_a_usage_error_before_any_user_code_runs(change, message) -> None:
    calls = []

    def record(name, fn):
        def wrapped(*args, **kwargs):
            calls.append(name)
            return fn(*args, **kwargs)
        return wrapped

    arguments = dict(candidate=record("candidate", lambda x: x * 2), reference=record("reference", lambda x: x * 2),
                     make_inputs=record("make_inputs", _make))
    arguments.update(change)
    positional = [arguments.pop(name) for name in ("candidate", "reference", "make_inputs")]
    with pytest.raises(DitgateUsageError) as excinfo:
        check_kernel(*positional, **arguments)
    text = str(excinfo.value)
    assert re.search(message.replace("*", ".*").replace("[[]", r"\[").replace("[]]", r"\]").replace("(", r"\(")
                     .replace(")", r"\)"), text), text
    assert calls == []  # nothing of the user's ran: the error came before any work
    assert len(text) < 400


def test_reference_and_make_inputs_swapped_are_named() -> None:
    # a one-argument reference in make_inputs' place: called with the seed, it returns no tensor
    with pytest.raises(DitgateUsageError, match=r"make_inputs\(0\) returned int 0, with no tensor in it.*order of the "
                                                r"arguments"):
        check_kernel(lambda x: x * 2, _make, lambda x: x * 2)


def test_make_inputs_that_raises_is_its_own_error_with_a_note() -> None:
    def make_inputs(seed):
        return torch.log(seed)  # the reference's code in make_inputs' place: torch refuses the int seed

    with pytest.raises(TypeError) as excinfo:
        check_kernel(lambda x: x, lambda x: x, make_inputs)
    (note,) = excinfo.value.__notes__
    assert note.startswith("ditgate: raised by make_inputs `test_make_inputs_that_raises_is_its_own_error_with_a_note"
                           ".<locals>.make_inputs`(0) (trial 1 of 5, seed 0)")
    assert "the arguments are in the wrong order" in note


@pytest.mark.parametrize("error", [ValueError, TypeError])
def test_a_reference_that_raises_is_raised_once_as_its_own(error) -> None:
    """TypeError is retried on float32 copies: the user's exception still comes once, never chained."""
    seen = []

    def reference(x):
        seen.append(x.dtype)
        raise error("bad reference")

    with pytest.raises(error, match="bad reference") as excinfo:
        check_kernel(lambda x: x, reference, _make)
    exc = excinfo.value
    assert exc.__cause__ is None and exc.__context__ is None  # no "during handling of the above exception"
    (note,) = exc.__notes__
    assert "raised by the reference `test_a_reference_that_raises_is_raised_once_as_its_own.<locals>.reference` on " \
           "float64 copies of the inputs" in note and "(trial 1 of 5, seed 0)" in note
    assert ("float32 copies raised the same" in note) == (error is TypeError)
    assert seen == ([torch.float64, torch.float32] if error is TypeError else [torch.float64])


REPORTED = """
import torch
from pytest_ditgate.correctness.inputs import make_tensor

def make(seed):
    return (make_tensor((4, 8), "float32", seed=seed),)

def bad_reference(x):
    raise ValueError("bad reference")

def crashing_kernel(x):
    raise ZeroDivisionError("kernel bug")

def test_reference_raises(kernel_check):
    kernel_check(lambda x: x, bad_reference, make)

def test_candidate_crashes(kernel_check):
    kernel_check(crashing_kernel, lambda x: x, make)

def test_nan_reference(kernel_check):
    kernel_check(torch.log, torch.log, make)
"""


def test_the_report_shows_the_users_frames_and_no_plugin_frames(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user=REPORTED)
    result = pytester.runpytest("--ditgate", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(failed=3)
    out = result.stdout.str()
    # the user's own line and message, once; none of the plugin's frames, no chained retry
    result.stdout.fnmatch_lines(["*raise ValueError(\"bad reference\")", "E       ValueError: bad reference",
                                 "E       ditgate: raised by the reference `bad_reference` on float64 copies*"])
    assert out.count("E       ValueError: bad reference") == 1
    assert "During handling of the above exception" not in out
    for internal in ("correctness/checks.py", "correctness/plugin.py", "pytest_ditgate/reporting.py"):
        assert internal not in out, internal
    # the candidate's crash: its own frame as the cause, the [crash] verdict first in the summary
    result.stdout.fnmatch_lines(["*raise ZeroDivisionError(\"kernel bug\")", "E       ZeroDivisionError: kernel bug",
                                 "*The above exception was the direct cause*",
                                 "FAILED test_user.py::test_candidate_crashes - [[]crash[]] *",
                                 "FAILED test_user.py::test_nan_reference - [[]reference_nonfinite[]] *"])
    assert "kernel_check = <kernel_check fixture: " in out  # one short line, not an object repr
    assert not (pytester.path / ".ditgate" / "bench.jsonl").exists()  # nothing recorded for a failed check
