"""The conditioning of an output: how far rounding in the reference's own intermediate results moves it.

Where an output cancels to nearly nothing (RMSNorm's backward at a normalised dimension of 1: the gradient
is eps-sized, the difference of two O(1) terms), every kernel at a given precision errs far beyond the
ceiling set for well-conditioned outputs, and one run of the reference at that precision is a poor guide to
how far: its error is a single draw, and another order of the same operations errs several times more or
less (a Liger-style RMSNorm backward against torch's autograd: up to 20x over 200 seeds).

Monte Carlo arithmetic (Parker, 1997; Verificarlo) measures it instead: the reference runs in float64 with
its floating inputs and every floating intermediate result multiplied by ``1 + u * xi``, ``xi`` uniform in
[-1, 1] per element and ``u`` one rounding of the accumulator, a few times; the RMS of the output's relative
error over the runs is about what any kernel that computes the same thing at that precision errs by. The
inputs are perturbed too because a kernel that forms an intermediate as large as its inputs rounds at their
scale: a cross entropy of logits near 1e3 that computes ``exp(x - lse)`` errs by ``u * |x|`` in every
exponent, as its conditioning says, however stable the reference's own order is. It is measured on the
reference alone (the candidate cannot inflate it), with a seeded generator, and only where an output still
fails once the other honest-error terms are in.

A contraction (a GEMM, a batched GEMM, a convolution) errs by more than one rounding of its result: its sum of
``K`` products errs by about ``u`` times the size of its terms, ``u * (|A| @ |B|)``, which exceeds ``u * |A @ B|``
wherever the products cancel. Where such an intermediate feeds a nonlinear op, that larger error is what moves
the output: an attention's scores at inputs x 1e3 are about 1e6, their fp32 sums err by about 3 (not by one
rounding, 0.06), and where two keys' scores lie within that, the softmax weights them otherwise (against one
rounding per result, torch's own fp32 attention errs by 3.5 times its elementwise allowance on 126 of 8.4M
outputs). So the runs are repeated with each contraction's result also moved by ``u * (|A| @ |B|) * xi``,
``xi`` uniform in [-sqrt 3, sqrt 3] (an RMS of one: the sum errs by about ``u`` times its terms' size as an
RMS, not as a bound; torch's fp32 efficient-attention kernel on an H100 moved a near-tied score by about 5.5
times that, within the factor 8 an element's allowance gives its simulated error). That error of each element
counts toward its own allowance only: the norm's conditioning and the ceiling it lifts stay those of one
rounding per result, which the bound's magnitude term already complements for the output's own sums.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from pytest_ditgate.correctness import compare

#: runs of the reference under rounding noise (RMS over them)
RUNS = 4

#: a contraction's sum error per unit of ``roundoff * (|A| @ |B|)``: ``xi`` scaled to an RMS of one
SUM_ERROR_RMS = math.sqrt(3)

#: ops whose result is exact (a copy, a selection, a comparison): their results are not perturbed
_EXACT = frozenset({
    "clone", "_to_copy", "copy", "detach", "lift_fresh", "lift_fresh_copy", "alias", "contiguous",
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "ones",
    "ones_like", "full", "full_like", "new_zeros", "new_ones", "new_full", "scalar_tensor", "arange",
    "abs", "neg", "sign", "relu", "clamp", "clamp_min", "clamp_max", "maximum", "minimum", "max", "min",
    "amax", "amin", "sort", "topk", "where", "masked_fill", "index", "index_select", "gather", "take", "cat",
    "stack", "constant_pad_nd", "embedding", "embedding_dense_backward", "select_backward", "slice_backward",
    "index_put", "scatter", "fill", "zero", "eq", "ne", "lt", "le", "gt", "ge", "isnan", "isinf", "isfinite",
    "logical_not", "logical_and", "logical_or", "floor", "ceil", "round", "trunc", "expand_copy", "repeat",
    "flip", "roll", "tril", "triu", "one_hot", "nll_loss_backward",
})


#: contractions (aten overload packets): their sums of products err by about ``u`` times the size of their terms
_CONTRACTIONS = frozenset({"mm", "bmm", "addmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot",
                           "convolution", "_convolution"})


class RoundingNoise(TorchDispatchMode):
    """While active, each floating result of a rounding op that does not alias its inputs is multiplied by
    ``1 + roundoff * xi`` (``xi`` uniform in [-1, 1], per element, from a seeded generator per device; with
    ``signs``, ``xi`` is -1 or 1: every rounding as large as it gets, so that an element's error over a few runs
    does not depend on how small its draws happened to be). With
    ``contractions``, a contraction's result also moves by ``roundoff * (the op on |inputs|) * sqrt(3) * xi``: the
    error of its sum of products, with an RMS of one ``roundoff`` per unit of its terms' size. ``contracted``
    tells whether a contraction ran."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __init__(self, roundoff: float, seed: int, contractions: bool = False, signs: bool = False) -> None:
        super().__init__()
        self.roundoff, self.seed, self.contractions, self.signs = roundoff, seed, contractions, signs
        self.contracted = False
        self.generators: dict[torch.device, torch.Generator] = {}

    def perturb(self, tensor: torch.Tensor) -> torch.Tensor:
        """An input as a kernel's first rounding leaves it (floating tensors only)."""
        if (tensor.is_floating_point() or tensor.is_complex()) and tensor.numel():
            return self._noise(tensor)
        return tensor

    def _xi(self, tensor: torch.Tensor) -> torch.Tensor:
        """Uniform in [-1, 1] per element of ``tensor``, from the device's seeded generator."""
        generator = self.generators.get(tensor.device)
        if generator is None:
            generator = self.generators[tensor.device] = torch.Generator(tensor.device).manual_seed(self.seed)
        real = torch.float64 if tensor.dtype in (torch.float64, torch.complex128) else torch.float32
        uniform = torch.rand(tensor.shape, dtype=real, device=tensor.device, generator=generator) * 2 - 1
        return uniform.sign_() if self.signs else uniform

    def _noise(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor * (1 + self.roundoff * self._xi(tensor)).to(tensor.dtype)

    def _contraction_error(self, func: Any, args: Any, kwargs: Any, out: Any) -> Any:
        """``out`` moved by ``roundoff * (func on |inputs|) * sqrt(3) * xi``: the error of a sum of products, as
        large as its terms (None to leave it: a result that is not one real floating tensor)."""
        if not isinstance(out, torch.Tensor) or not out.is_floating_point() or not out.numel():
            return None

        def magnitude(value: Any) -> Any:
            return value.abs() if isinstance(value, torch.Tensor) and value.is_floating_point() else value

        size = func(*tree_map(magnitude, args), **tree_map(magnitude, kwargs or {})).abs()
        return out + (self.roundoff * SUM_ERROR_RMS) * size * self._xi(out).to(out.dtype)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's signature
        out = func(*args, **(kwargs or {}))
        schema = func._schema
        if (func.overloadpacket.__name__ in _EXACT or schema.is_mutable
                or any(ret.alias_info is not None for ret in schema.returns)):
            return out
        if func.overloadpacket.__name__ in _CONTRACTIONS:
            self.contracted = True
            moved = self._contraction_error(func, args, kwargs, out) if self.contractions else None
            if moved is not None:
                out = moved

        def perturb(value: Any) -> Any:
            if isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex()) \
                    and value.numel() and value.dtype.itemsize >= 4:
                return self._noise(value)
            return value

        return tree_map(perturb, out)


def _math_attention() -> Any:
    """A context in which ``scaled_dot_product_attention`` runs torch's math backend (a no-op context where
    this torch has no ``torch.nn.attention``)."""
    import contextlib

    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # pragma: no cover - torch older than 2.3
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.MATH])


@dataclass
class Conditioning:
    """Per output: the RMS over the runs of its rel-norm error (``relative``) and of each element's error
    (``elementwise``, float32, the output's shape); ``notes`` on outputs it could not measure."""

    relative: dict[str, float] = field(default_factory=dict)
    elementwise: dict[str, torch.Tensor] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def measure(run: Callable[[Any], list[tuple[str, torch.Tensor]]], reference: dict[str, torch.Tensor], *,
            roundoff: float, seed: int, runs: int = RUNS, signs: bool = False) -> Conditioning:
    """Each output's error when ``run(mode)`` (the reference on float64 copies under the dispatch ``mode``,
    returning its named outputs) runs ``runs`` times with a :class:`RoundingNoise`, against ``reference``
    (name -> the float64 output): the RMS of its rel-norm error, and of each element's (an element's own
    conditioning: where a few rows cancel, the norm is the others'). Where the reference contracts, each
    element's error is the larger of that and its RMS over ``runs`` more runs with the contractions' errors
    (the module's docstring says why only the elements'). ``signs``: every rounding at its full size
    (:class:`RoundingNoise`)."""
    result, contracted = _runs(run, reference, roundoff=roundoff, seed=seed, runs=runs, contractions=False,
                               signs=signs)
    if contracted and result.elementwise:
        wider, _ = _runs(run, {name: reference[name] for name in result.elementwise}, roundoff=roundoff,
                         seed=seed + 7919, runs=runs, contractions=True, signs=signs)
        for name, spread in wider.elementwise.items():
            torch.maximum(result.elementwise[name], spread, out=result.elementwise[name])
    return result


def _runs(run: Callable[[Any], list[tuple[str, torch.Tensor]]], reference: dict[str, torch.Tensor], *,
          roundoff: float, seed: int, runs: int, contractions: bool, signs: bool = False) -> tuple[Conditioning, bool]:
    """:func:`measure`'s runs under one noise model; also whether a contraction ran."""
    squares: dict[str, list[float]] = {name: [] for name in reference}
    spread: dict[str, torch.Tensor] = {}
    contracted = False
    for index in range(runs):
        mode = RoundingNoise(roundoff, seed * 1000 + index, contractions=contractions, signs=signs)
        with _math_attention():  # fused attention hides its GEMMs and softmax from the mode: run them as ops
            outputs = dict(run(mode))
        contracted = contracted or mode.contracted
        for name, ref in reference.items():
            if name not in squares:
                continue
            other = outputs.get(name)
            norm = compare.norm(ref)
            gap = None if other is None or other.shape != ref.shape or norm == 0 else \
                compare.gap_norm(other, ref)
            if gap is None:
                del squares[name]
                spread.pop(name, None)
                continue
            squares[name].append((gap / norm) ** 2)
            total = spread.setdefault(name, torch.zeros(ref.numel(), dtype=torch.float32, device=ref.device))
            for start, (o, r) in compare.chunks(other, ref, device=ref.device):
                error = (o.double() - r.double()).nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
                total[start:start + error.numel()] += error.square_().float()
        del outputs
    result = Conditioning()
    for name, values in squares.items():
        if values:
            result.relative[name] = math.sqrt(sum(values) / len(values))
            result.elementwise[name] = spread[name].div_(len(values)).sqrt_().reshape(reference[name].shape)
    result.notes = [f"conditioning of {name} not measured (the perturbed reference was non-finite, zero or shaped "
                    "otherwise)" for name in reference if name not in result.relative]
    return result, contracted
