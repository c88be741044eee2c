"""Correct before fast: ``ditbench.pair``'s agreement check, and the judge of its audited timed calls.

Before timing, :func:`agree` checks once that the candidate computes what the reference computes on the pair's
arguments: ``check_kernel`` with one trial (:func:`check_outputs`), whatever the arguments are (closures and sizes
get a stand-in tensor the functions never see). After timing, the pair judges each audited call's output by the
same check, against the reference on that call's own inputs.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from pytest_ditgate.arguments import callable_name, clip
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
                  kwargs: dict[str, Any], *, label: str, probe: bool = True) -> str:
    """``check_kernel`` with one trial on these arguments (the reference on float64 copies, or on the arguments
    themselves when it cannot run upcast; no extremal trials, no poisoning; the precision probe unless ``probe``
    is off). Arguments with no tensor (closures, sizes) are checked too: a stand-in tensor the functions never see
    is added. Raises the check's ``GateFailure``; returns :data:`AGREED`, or :data:`NOT_TENSORS` when the outputs
    hold no tensor to compare."""
    __tracebackhide__ = True
    import torch

    from pytest_ditgate.correctness.checks import check_kernel
    from pytest_ditgate.correctness.structure import named_leaves

    if not any(isinstance(leaf, torch.Tensor) for _, leaf in named_leaves((args, kwargs), "args")):
        candidate, reference = _without_stand_in(candidate), _without_stand_in(reference)
        kwargs = dict(kwargs, **{STAND_IN: torch.zeros(1)})

    def inputs(_: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return args, kwargs

    settings = dict(trials=1, input_scales=(), check_determinism=False, check_constant=False, poison_memory=False,
                    label=label, **({} if probe else {"check_precision": False}))
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
        if "compares tensor outputs only" in str(exc):
            return NOT_TENSORS
        raise
    except GateFailure as failure:
        if failure.reason == "shape" and "returned None" in failure.message and reference(*args, **kwargs) is None:
            return NOT_TENSORS  # both return nothing: there is no output to compare
        raise
    return AGREED


def agree(candidate: Callable[..., Any], reference: Callable[..., Any], args: tuple[Any, ...],
          kwargs: dict[str, Any]) -> str:
    """Check once, before timing, that ``candidate(*args, **kwargs)`` computes what ``reference`` computes
    (:func:`check_outputs`). Raises the check's ``GateFailure`` (a timing function replaced while the check ran
    is ``timer_tampered``, said as such); returns :data:`AGREED` or why the outputs were not compared."""
    __tracebackhide__ = True
    try:
        return check_outputs(candidate, reference, args, kwargs, label="ditbench.pair agreement")
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
        raise GateFailure(failure.reason, "ditbench.pair: the candidate does not compute what the reference "
                          "computes, so nothing was timed (checked once on the pair's arguments; verify=False "
                          f"skips it for functions not meant to agree): {failure.message}",
                          report=failure.report) from None
