"""Outputs that share memory with a read-only input: a kernel that returns a view of its input (a slice, a
reshape, the input itself) returns the right values, yet the caller's next write into the input changes the
output, and a write into the output changes the input.

The gate records which returned tensors overlap the bytes of an argument the kernel may not write (every
argument but ``out_args``, ``inout_args`` and ``scratch_args``), on the candidate's calls and on the
reference's; an overlap fails ``aliased_output`` unless the reference returns a view of its input there too
(a reshape or slicing op, whose contract is the view; a cast that returns its input when the dtype already
matches, seen in the run on the inputs' own dtypes).

A returned tensor that shares elements with a ``scratch_args`` workspace (the workspace itself, a slice of a
larger one) fails ``aliased_output`` whatever the reference does: scratch holds unspecified contents on entry
to every call, so the kernel's next call, or anything else the caller lends the workspace to, overwrites the
"result". A declared out buffer or in-out argument returned as an output stays allowed: the caller owns it as
the result.
"""

from __future__ import annotations

from typing import Any, Iterable


def overlaps(outputs: Iterable[tuple[str, Any]], inputs: Iterable[tuple[str, Any]]) -> tuple[tuple[str, str], ...]:
    """``(output name, input name)`` for each output that shares elements with an input (empty tensors and
    tensors on different devices never do). Two views of one buffer whose byte ranges interleave without a
    shared element (an input and an out buffer that are the two halves of each row) do not count."""
    inputs = list(inputs)
    found = []
    for out_name, out in outputs:
        for in_name, tensor in inputs:
            if tensor.device == out.device and _shares_elements(out, tensor):
                found.append((out_name, in_name))
                break
    return tuple(found)


def _shares_elements(a: Any, b: Any) -> bool:
    """Whether two tensors' elements overlap: their byte ranges do, and one's first or last element lies on
    an element of the other (every view made by slicing, transposing, reshaping or reinterpreting does)."""
    (a_start, a_end), (b_start, b_end) = _span(a), _span(b)
    if a_start == a_end or b_start == b_end or a_end <= b_start or b_end <= a_start:
        return False
    return (_holds(b, a_start) or _holds(a, b_start) or _holds(b, a_end - a.element_size())
            or _holds(a, b_end - b.element_size()))


def _holds(tensor: Any, address: int) -> bool:
    """Whether ``address`` lies inside one of the tensor's elements: the offset decomposed greedily over its
    strides, largest first (exact for a layout without internal overlap)."""
    offset = address - tensor.data_ptr()
    if offset < 0:
        return False
    size_of = tensor.element_size()
    for size, stride in sorted(zip(tensor.shape, tensor.stride()), key=lambda pair: -abs(pair[1])):
        step = abs(stride) * size_of
        if size > 1 and step:
            offset -= min(offset // step, size - 1) * step
    return 0 <= offset < size_of


def _span(tensor: Any) -> tuple[int, int]:
    """The byte range from a tensor's first element to the end of its last (``(0, 0)`` when it is empty)."""
    if tensor.numel() == 0:
        return 0, 0
    extent = sum((size - 1) * abs(stride) for size, stride in zip(tensor.shape, tensor.stride()))
    start = tensor.data_ptr()
    return start, start + (extent + 1) * tensor.element_size()


def scratch_returned(output: str, workspace: str) -> tuple[str, list[str]]:
    """``(headline, details)`` of the ``aliased_output`` failure of an output that shares elements with the
    scratch argument ``workspace``."""
    return (f"{output} is a view of the candidate's scratch argument {workspace} (first call)", [
        f"{output} shares memory with {workspace}, declared in scratch_args: a workspace whose contents are "
        f"unspecified on entry to every call, so the kernel's next call (or any other use of the workspace) "
        f"overwrites {output} after it was returned",
        "return a copy (.clone()); a kernel meant to leave its result in that buffer declares it as an output: "
        "out_args=(...) (written, then compared as the output)"])
