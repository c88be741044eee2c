"""Correct before fast: ``ditbench.pair``'s agreement check, and the judge of its audited timed calls.

Before timing, :func:`agree` checks once that the candidate computes what the reference computes on the pair's
arguments: ``check_kernel`` with one trial (:func:`check_outputs`), whatever the arguments are (closures and sizes
get a stand-in tensor the functions never see). The arguments the pair declares written
(:mod:`pytest_ditgate.bench.declared`) are compared after the call, as ``check_kernel`` compares them, on copies:
the pair's own arguments are never written.

Something must be compared. Two functions that both return None, with no out or in-out argument declared, would
agree whatever they did (a kernel that does nothing would pass as the fastest): a usage error names the arguments
the reference writes and how to declare them. Outputs that hold no tensor on either side (Python numbers) are
not compared, and the record says so (:data:`NOT_TENSORS`); a tensor on one side only is a ``shape`` failure,
and tensors beside other values a usage error, as in ``check_kernel``.

After timing, :func:`judge` judges an audited call's result (its return value and its out and in-out arguments,
copied as it returned) by the same check, against the reference on that call's own inputs.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from pytest_ditgate.arguments import callable_name, clip, describe, raised_by
from pytest_ditgate.bench.declared import Declared, Result, replay
from pytest_ditgate.correctness.roles import key_name
from pytest_ditgate.errors import DitgateUsageError, GateFailure

#: the keyword argument that stands in for a tensor when a pair's arguments hold none (check_kernel needs one);
#: the functions never see it
STAND_IN = "ditgate_stand_in"
#: what a pair's record says about its outputs
AGREED, NOT_TENSORS = "outputs agree", "outputs are not tensors: not compared"


def _without_stand_in(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        kwargs.pop(STAND_IN, None)
        return fn(*args, **kwargs)

    return call


def check_outputs(candidate: Callable[..., Any], reference: Callable[..., Any], args: tuple[Any, ...],
                  kwargs: dict[str, Any], *, label: str, declared: Declared | None = None, probe: bool = True) -> str:
    """``check_kernel`` with one trial on these arguments (the reference on float64 copies, or on the arguments
    themselves when it cannot run upcast; no extremal trials; the precision probe unless ``probe`` is off), the
    ``declared`` arguments compared as ``check_kernel`` compares them (its out buffers poisoned before the call)
    on copies made for each run. Arguments with no tensor (closures, sizes) are checked too: a stand-in tensor
    the functions never see is added. Raises the check's ``GateFailure``, or a usage error where nothing would
    be compared; returns :data:`AGREED`, or :data:`NOT_TENSORS` when neither side's output holds a tensor."""
    __tracebackhide__ = True
    import torch

    from pytest_ditgate.correctness.checks import check_kernel
    from pytest_ditgate.correctness.structure import named_leaves

    declared = declared if declared is not None else Declared()
    if not any(isinstance(leaf, torch.Tensor) for _, leaf in named_leaves((args, kwargs), "args")):
        candidate, reference = _without_stand_in(candidate), _without_stand_in(reference)
        kwargs = dict(kwargs, **{STAND_IN: torch.zeros(1)})

    def inputs(_: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return declared.copies(args, kwargs)  # in-out arguments start from the pair's values in every run

    settings = dict(trials=1, input_scales=(), check_determinism=False, check_constant=False,
                    poison_memory=bool(declared.roles.out), label=label, **declared.options(),
                    **({} if probe else {"check_precision": False}))
    try:
        try:
            check_kernel(candidate, reference, inputs, **settings)
            upcast = True
        except (GateFailure, DitgateUsageError):
            raise
        except Exception:  # noqa: BLE001 - a reference that cannot run on float64/float32 copies: same precision
            upcast = False
        if not upcast:  # outside the handler: the reference's own error, if it raises again, is not chained
            check_kernel(candidate, reference, inputs, reference_dtype="same", **settings)
    except DitgateUsageError as exc:
        if "compares tensor outputs only" in str(exc) and not declared.compared:
            return _without_tensors(candidate, reference, args, kwargs, exc)
        raise
    except GateFailure as failure:
        if failure.reason == "shape" and "returned None" in failure.message and not declared.compared:
            returned, written = _on_copies(reference, args, kwargs)
            if _nothing(returned):
                raise _nothing_compared(candidate, reference, written, both=True) from None
        raise
    return AGREED


def _nothing(value: Any) -> bool:
    """None, or containers holding only None."""
    from pytest_ditgate.correctness.structure import named_leaves

    return all(leaf is None for _, leaf in named_leaves(value, "out"))


def _holds_tensor(value: Any) -> bool:
    from pytest_ditgate.correctness.structure import named_tensors

    return any(True for _ in named_tensors(value, "out"))


def _on_copies(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, list[int | str]]:
    """What ``fn`` returns on copies of every tensor argument, and the keys (positions, keyword names) of the
    tensor arguments it wrote: the pair's own arguments stay as they are."""
    from pytest_ditgate.bench.fresh_inputs import layout_copy, same_bits
    from pytest_ditgate.correctness.structure import is_tensor, map_tensors

    copies = map_tensors((args, kwargs), layout_copy)
    keys = [(i, arg) for i, arg in enumerate(copies[0])] + [(k, v) for k, v in copies[1].items() if k != STAND_IN]
    before = {key: value.detach().clone() for key, value in keys if is_tensor(value)}
    try:
        returned = fn(*copies[0], **copies[1])
    except Exception as exc:
        raised_by(exc, f"`{callable_name(fn)}`, run once more on copies of the pair's arguments to see what it "
                       "returns, as the check before timing compared no tensor")
        raise
    return returned, [key for key, value in keys if key in before and not same_bits(value, before[key])]


def _nothing_compared(candidate: Callable[..., Any], reference: Callable[..., Any], written: list[int | str], *,
                      both: bool) -> DitgateUsageError:
    """The usage error of a pair whose agreement check would compare nothing: the reference returns None (the
    candidate too, when ``both``) and no out or in-out argument is declared."""
    who = (f"the candidate `{callable_name(candidate)}` and the reference `{callable_name(reference)}` both return "
           "None" if both else f"the reference `{callable_name(reference)}` returns None")
    if written:
        keys, them = repr(tuple(written)), "it" if len(written) == 1 else "them"
        remedy = (f"The reference writes {', '.join(key_name(k) for k in written)}: declare {them}, out_args={keys} "
                  f"if the functions only write {them}, inout_args={keys} if they read and update {them} in place "
                  "(as for check_kernel)")
    else:
        remedy = ("Declare the arguments the functions write, as for check_kernel: out_args=(...) for output "
                  "buffers, inout_args=(...) for arguments updated in place (the reference writes none of the "
                  "pair's tensor arguments: a buffer that a closure or a global holds must be passed as an "
                  "argument to be declared)")
    return DitgateUsageError(
        f"ditbench.pair: {who} and no out_args or inout_args are declared, so the check before timing would compare "
        f"nothing and a function that does nothing would pass as the faster; nothing was timed. {remedy}; or pass "
        "verify=False for two functions not meant to agree.")


def _without_tensors(candidate: Callable[..., Any], reference: Callable[..., Any], args: tuple[Any, ...],
                     kwargs: dict[str, Any], refused: DitgateUsageError) -> str:
    """The reference's output holds no tensor, or values beside its tensors (``check_kernel`` refused it):
    :data:`NOT_TENSORS` where neither side returns a tensor (numbers, strings), else why nothing honest can be
    said: a reference that returns None (a usage error), values beside tensors (the check's usage error), a
    tensor on the candidate's side only (``shape``)."""
    returned, written = _on_copies(reference, args, kwargs)
    if _nothing(returned):
        raise _nothing_compared(candidate, reference, written, both=False) from None
    if _holds_tensor(returned):
        raise DitgateUsageError(f"ditbench.pair: {refused}; or pass verify=False for two functions not meant to "
                                "agree. Nothing was timed.") from None
    output, _ = _on_copies(candidate, args, kwargs)
    if _holds_tensor(output):
        raise GateFailure("shape", f"the candidate `{callable_name(candidate)}` returned {describe(output)}, the "
                          f"reference `{callable_name(reference)}` {describe(returned)}: their outputs cannot be "
                          "compared") from None
    return NOT_TENSORS


def agree(candidate: Callable[..., Any], reference: Callable[..., Any], args: tuple[Any, ...],
          kwargs: dict[str, Any], declared: Declared | None = None) -> str:
    """Check once, before timing, that ``candidate(*args, **kwargs)`` computes what ``reference`` computes
    (:func:`check_outputs`). Raises the check's ``GateFailure`` (a timing function replaced while the check ran
    is ``timer_tampered``, said as such); returns :data:`AGREED` or why the outputs were not compared."""
    __tracebackhide__ = True
    try:
        return check_outputs(candidate, reference, args, kwargs, declared=declared, label="ditbench.pair agreement")
    except GateFailure as failure:
        if failure.reason == "timer_tampered":
            raise GateFailure(failure.reason, "ditbench.pair: timing functions were replaced while the agreement "
                              "check ran the candidate and the reference, so by one of them; nothing was timed: "
                              f"{failure.message}", report=failure.report) from None
        cause = failure.__cause__
        if failure.reason == "crash" and cause is not None:
            raise GateFailure("crash", f"the candidate `{callable_name(candidate)}` raised {type(cause).__name__} "
                              "when checked against the reference before timing, so nothing was timed or recorded: "
                              f"{clip(f'{type(cause).__name__}: {cause}')}", report=failure.report) from cause
        if failure.reason == "input_mutated":
            raise GateFailure(failure.reason, "ditbench.pair: checked once against the reference before timing, a "
                              "function wrote where it may not, so nothing was timed (the pair declares the "
                              "arguments its functions write with out_args=, inout_args= and scratch_args=, as "
                              f"check_kernel does): {failure.message}", report=failure.report) from None
        raise GateFailure(failure.reason, "ditbench.pair: the candidate does not compute what the reference "
                          "computes, so nothing was timed (checked once on the pair's arguments; verify=False "
                          f"skips it for functions not meant to agree): {failure.message}",
                          report=failure.report) from None


def judge(reference: Callable[..., Any], declared: Declared) -> Callable[[Result, tuple[Any, ...], dict[str, Any]],
                                                                          None]:
    """The judge of an audited timed call (:data:`pytest_ditgate.bench.audit.Judge`): its result, replayed as the
    candidate (:func:`pytest_ditgate.bench.declared.replay`), checked against the reference on that call's own
    inputs (no precision probe: a recorded result cannot respond to moved inputs)."""
    def judged(result: Result, call_args: tuple[Any, ...], call_kwargs: dict[str, Any]) -> None:
        check_outputs(replay(declared, result), reference, call_args, call_kwargs, declared=declared, probe=False,
                      label="ditbench.pair output audit")

    return judged
