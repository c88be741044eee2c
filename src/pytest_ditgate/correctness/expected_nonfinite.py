"""Non-finite values a reference returns on purpose: ``check_kernel(..., nonfinite="match")``.

By default a reference that returns NaN or Inf fails ``reference_nonfinite``: it checks nothing where it is
not finite, and most often it has left its domain (``log`` of a negative input). Some ops define infinities:
a causally masked ``log_softmax`` is -inf at the masked positions, an attention's log-sum-exp is -inf on a
row with no key, masked log-probabilities are -inf where the mask is. For those the declaration
``nonfinite="match"`` makes the reference's non-finite values expected values:

- the candidate must return exactly the same non-finite value (+inf, -inf, NaN) at exactly the same elements:
  a finite value where the reference is -inf, or +inf where it is -inf, fails ``mismatch`` naming the element;
  a non-finite value where the reference is finite fails ``nonfinite`` as without the declaration;
- the finite elements are compared as usual, with every bound computed over them alone (the output's mean
  magnitude, norms, the honest-error runs): an output that is 99 % masked is not held to a hundredth of its
  finite elements' scale;
- an output the reference returns non-finite on every element still fails ``reference_nonfinite``: nothing
  is left to compare;
- an extremal trial whose reference is non-finite elsewhere than on the same inputs at unit scale (an ``exp``
  that overflows at inputs x 1e3) is skipped, as it is without the declaration: the declared values are the
  op's structure, which a scale does not move.

NaN is matched too, because a NaN can be the contract: a max, ReLU or softmax kernel must propagate a NaN
input as torch does, and a CUDA ``fmaxf`` that drops it is a real bug only a NaN-matching check can see. The
match is exact per element and per kind (NaN matches only NaN), unwritten output memory still fails as
``stale_output`` (its poison is told apart from the reference's NaN), and an all-NaN reference fails as above,
so a reference that is NaN everywhere by mistake is not a pass even when declared.

Without the declaration, ``reference_nonfinite``'s message names it where the reference's non-finite values
look structural (:func:`looks_structural`: infinities only, no NaN, the finite elements far from float
overflow). Importing this module is torch-free.
"""

from __future__ import annotations

from typing import Any

#: the values ``nonfinite=`` takes: ``"reject"`` (the default: a non-finite reference is ``reference_nonfinite``)
#: and ``"match"`` (its non-finite values are expected, element for element)
MODES = ("reject", "match")
#: finite values at least this large sit near float overflow: infinities beside them may be overflow
NEAR_OVERFLOW = 2.0 ** 1000


def parse(value: Any, call: str) -> bool:
    """Whether ``nonfinite=`` declares the reference's non-finite values expected; a usage error otherwise."""
    from pytest_ditgate.arguments import describe
    from pytest_ditgate.errors import DitgateUsageError

    if not isinstance(value, str) or value not in MODES:
        raise DitgateUsageError(f"{call}: nonfinite must be 'reject' (the default: a reference that returns NaN or "
                                "Inf fails reference_nonfinite) or 'match' (its NaN and infinities are expected: "
                                f"the candidate must return the same ones at the same elements), got {describe(value)}")
    return value == "match"


def codes(tensor: Any) -> Any:
    """Per element: 0 finite, 1 +inf, 2 -inf, 3 NaN (int8, the tensor's shape)."""
    import torch

    out = torch.zeros(tensor.shape, dtype=torch.int8, device=tensor.device)
    if tensor.is_floating_point() or tensor.is_complex():
        real = torch.view_as_real(tensor).sum(-1) if tensor.is_complex() else tensor
        out.masked_fill_(real == float("inf"), 1)
        out.masked_fill_(real == float("-inf"), 2)
        out.masked_fill_(real.isnan(), 3)
    return out


def signature(outputs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A small summary of where each floating output is non-finite and how (equal only for equal patterns, up to
    an exact coincidence; see :func:`compare.fingerprint`)."""
    from pytest_ditgate.correctness import compare

    return {name: compare.fingerprint(codes(t)) for name, t in outputs if t.is_floating_point() or t.is_complex()}


def has_nonfinite(tensor: Any) -> bool:
    """Whether a floating tensor holds a NaN or an infinity."""
    import torch

    if not (tensor.is_floating_point() or tensor.is_complex()):
        return False
    return bool((~torch.isfinite(tensor)).any())


def all_nonfinite(tensor: Any) -> bool:
    """Whether a non-empty floating tensor is non-finite on every element."""
    import torch

    return tensor.numel() > 0 and (tensor.is_floating_point() or tensor.is_complex()) and \
        not bool(torch.isfinite(tensor).any())


def differences(candidate: Any, reference: Any) -> tuple[int, tuple[int, ...] | None]:
    """``(count, first index)`` of the elements where the reference is non-finite and the candidate does not hold
    the same value (the same infinity, or NaN beside NaN)."""
    import torch

    from pytest_ditgate.correctness import compare

    flat = reference.detach().reshape(-1)

    def mask(chunk: Any, start: int) -> Any:
        ref = flat[start:start + chunk.numel()].to(chunk.device)
        expected = codes(ref)
        return (expected != 0) & (codes(chunk) != expected)

    if not (candidate.is_floating_point() or candidate.is_complex()):  # an integer output cannot hold them
        count = int((~torch.isfinite(reference)).sum())
        return count, (compare.first_where(reference, lambda c, _: ~torch.isfinite(c))[1] if count else None)
    return compare.first_where(candidate, mask)


def mismatch(name: str, candidate: Any, reference: Any) -> tuple[str, list[str]] | None:
    """``(headline, details)`` of the ``mismatch`` failure of an output that does not hold the reference's
    non-finite value somewhere (:func:`differences`), or None."""
    count, where = differences(candidate, reference)
    if not count:
        return None
    got, expected = (kind(complex(t[where]).real if t.is_complex() else float(t[where]))
                     for t in (candidate, reference))
    return f"{name} is {got} at index {where} where the reference is {expected}", [
        f"{count} of {candidate.numel()} elements of {name} differ from the reference's non-finite value there; "
        f"first at index {where}: candidate {got} vs reference {expected}",
        "nonfinite='match' expects the reference's NaN and infinities as values: the candidate must return the "
        "same one (+inf, -inf or NaN) at the same elements"]


def advice(name: str, reference: Any, *, declared: bool) -> tuple[str, list[str]]:
    """``(what to fix, lines of advice)`` for a ``reference_nonfinite`` failure of output ``name``: under the
    declaration, an output non-finite everywhere; without it, the declaration named where the non-finite values
    look structural (:func:`looks_structural`), the domain advice otherwise."""
    if declared:
        return "fix the reference or make_inputs", [
            f"nonfinite='match' expects the reference's NaN/Inf element for element, but every element of {name} is "
            "non-finite: nothing is left to compare"]
    if looks_structural(reference):
        return "fix the reference or make_inputs, or declare nonfinite='match'", [
            "if these infinities are the op's own values (a causal or padding mask, an attention's log-sum-exp of a "
            "row with no key, masked log-probabilities, log of 0), declare them: nonfinite='match' (the candidate "
            "must then return the same infinities at the same elements; the finite elements are compared as usual)",
            "otherwise the reference left its domain: draw inputs inside it (e.g. positive for log) or compute the "
            "reference stably"]
    return "fix the reference or make_inputs", [
        "a non-finite reference checks nothing there (a candidate returning the same NaN would match it): draw "
        "inputs inside the reference's domain (e.g. positive for log or sqrt) or compute the reference stably"]


def kind(value: float) -> str:
    """How a value reads in a message: ``+inf``, ``-inf``, ``nan``, or the number."""
    import math

    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "+inf" if value > 0 else "-inf"
    return f"{value:.6g}"


def finite_mask(reference: Any) -> Any:
    """The reference's finite elements, flat (what the bounds are computed over under the declaration)."""
    import torch

    return torch.isfinite(reference.detach().reshape(-1))


def compact(tensor: Any, keep: Any) -> Any:
    """``tensor``'s elements where ``keep`` holds, flat; ``tensor`` itself when None or shaped otherwise."""
    if tensor is None or keep is None or tensor.numel() != keep.numel():
        return tensor
    return tensor.detach().reshape(-1)[keep.to(tensor.device)]


class CompactedRuns:
    """A trial's honest-error runs (``get()`` -> ``outputs(structure)``, ``inputs_per_output``, ``notes``) with
    output ``name`` kept at the elements ``keep`` holds, as the compacted output it is compared with."""

    def __init__(self, runs: Any, name: str, keep: Any) -> None:
        self._runs, self._name, self._keep = runs, name, keep

    def get(self) -> "CompactedRuns":
        return self

    @property
    def notes(self) -> tuple[str, ...]:
        return self._runs.get().notes

    def inputs_per_output(self, output: Any) -> float | None:
        return self._runs.get().inputs_per_output(output)

    def outputs(self, structure: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        return tuple({key: compact(t, self._keep) if key == self._name else t for key, t in run.items()}
                     for run in self._runs.get().outputs(structure))


class CompactedConditionings:
    """A trial's conditioning runs (``get()``, ``stepwise()``) with output ``name``'s per-element errors kept at
    the elements ``keep`` holds."""

    def __init__(self, conditioned: Any, name: str, keep: Any) -> None:
        self._conditioned, self._name, self._keep = conditioned, name, keep

    def _compacted(self, measured: Any) -> Any:
        import dataclasses

        if self._name not in measured.elementwise:
            return measured
        elementwise = dict(measured.elementwise)
        elementwise[self._name] = compact(elementwise[self._name], self._keep)
        return dataclasses.replace(measured, elementwise=elementwise)

    def get(self) -> Any:
        return self._compacted(self._conditioned.get())

    def stepwise(self) -> Any:
        """``(roundoff, conditioning)`` op by op, compacted, or None."""
        found = self._conditioned.stepwise()
        return None if found is None else (found[0], self._compacted(found[1]))


def in_whole_output(result: Any, keep: Any, shape: tuple[int, ...]) -> Any:
    """A comparison of the compacted output, told in the whole output's terms: its shape, and the index of its
    worst element there (its element count stays the compared ones)."""
    result.shape = shape
    result.worst_index = full_index(keep, result.worst_index, shape)
    return result


def full_index(keep: Any, index: tuple[int, ...] | None, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The index in the whole output of element ``index`` of the compacted one (found chunk by chunk: no index
    tensor of the whole output)."""
    from pytest_ditgate.correctness import compare

    if index is None or not index:
        return index
    rank, flat = index[0], None
    for start, (chunk,) in compare.chunks(keep):
        kept = int(chunk.sum())
        if rank < kept:
            flat = start + int(chunk.nonzero()[rank, 0])
            break
        rank -= kept
    if flat is None:
        return index
    out = []
    for size in reversed(shape):
        out.append(flat % size if size else 0)
        flat = flat // size if size else 0
    return tuple(reversed(out))


def looks_structural(reference: Any) -> bool:
    """Whether the reference's non-finite values look like the op's own (a mask, a log of 0): infinities only,
    no NaN, and no finite element near float overflow (where an infinity may be an overflow instead)."""
    import torch

    wide = reference.detach()
    if wide.is_complex() or bool(wide.isnan().any()):
        return False
    finite = torch.isfinite(wide)
    if not bool(finite.any()):
        return True
    return float(wide[finite].abs().max()) < NEAR_OVERFLOW
