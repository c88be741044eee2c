"""The reference's own rounding noise per output element: how far its float64 rounding alone moves it.

The precision probe counts an element where the float64 reference moves by several spacings of the output's
dtype: an honest kernel's output must follow such a move. Where an output is zero by cancellation or by
structure, the reference's "move" can be its own rounding instead. LayerNorm's input gradient at a normalised
dimension of 1 is exactly 0 (the output does not depend on the input); a fused fp32 kernel returns 0, while
torch's float64 backward returns 0.0 at some inputs and -1.78e-15 at inputs moved within their cells: a
difference of O(1) terms, rounded in float64. That move is thousands of fp32 spacings at 1e-15, and no kernel
has to follow it (`tests/plugin/test_kcheck_probe_degenerate.py`).

This module measures that noise by Monte Carlo arithmetic at the reference's own precision (the method of
:mod:`~pytest_ditgate.correctness.conditioning`, whose :class:`RoundingNoise` it reuses): the reference runs
:data:`RUNS` times with its floating inputs and every floating intermediate result multiplied by
``1 + ROUNDOFF_ULPS * eps * xi`` (``eps`` the reference dtype's machine epsilon, ``xi`` uniform in [-1, 1]),
and each element's noise is the RMS of its difference from the unperturbed reference. A few ulps rather than
half of one: a perturbation of half an ulp rounds back to 1 for most elements, and a fused op whose internal
cancellation is hidden from the dispatch mode (torch's LayerNorm backward) shows its noise only through its
inputs' perturbation; the margin the probe puts on top (:data:`sensitivity.REFERENCE_NOISE_FACTOR`) covers the
rest.

One element's noise is one sample: where the runs happen to leave it exactly in place, its RMS is 0 although
the reference there holds nothing but rounding. So an element whose reference value is itself within
:data:`NEAR_ZERO` times the output's RMS noise of zero (zero by structure) gets at least that RMS. An element
whose perturbed value is not finite where the reference is gets an infinite noise (the reference is unstable
there: no move of it is a move an honest kernel must follow). Nothing else is pooled: a small but genuine
element (a softmax probability of 1e-11 beside ones of 0.1) keeps its own, smaller noise.

Measured on the reference alone (the candidate cannot inflate it), seeded, and only where the probe found an
output unmoved: it costs :data:`RUNS` more reference runs on a probe that would fail otherwise. Importing
this module is torch-free.
"""

from __future__ import annotations

from typing import Any, Callable

#: runs of the reference under its own rounding noise (RMS over them)
RUNS = 4
#: each result moves by up to this many ulps of the reference's dtype
ROUNDOFF_ULPS = 4.0
#: an element whose reference value lies within this many times the output's RMS noise of zero gets at least
#: that RMS as its noise (it is zero by structure: its own sample is one draw of noise)
NEAR_ZERO = 256.0


def measure(run: Callable[[Any], list[tuple[str, Any]]], reference: dict[str, Any], *, dtype: Any,
            seed: int, runs: int = RUNS) -> dict[str, Any]:
    """Each output's per-element rounding noise (float64, the output's shape) when ``run(mode)`` (the reference
    on copies in ``dtype`` under the dispatch ``mode``, its inputs passed through ``mode.perturb``, returning
    its named outputs) runs ``runs`` times, against ``reference`` (name -> its unperturbed output on the same
    inputs). An output that is not floating, or that a run returns shaped otherwise or not at all, is left
    out."""
    import torch

    from pytest_ditgate.correctness import compare
    from pytest_ditgate.correctness.conditioning import RoundingNoise

    roundoff = ROUNDOFF_ULPS * torch.finfo(dtype).eps
    wanted = {name: ref for name, ref in reference.items()
              if ref.is_floating_point() and ref.numel()}
    squares: dict[str, Any] = {}
    for index in range(runs):
        mode = RoundingNoise(roundoff, seed * 1000 + 104729 + index)
        outputs = dict(run(mode))
        for name, ref in list(wanted.items()):
            other = outputs.get(name)
            if other is None or tuple(other.shape) != tuple(ref.shape) or not other.is_floating_point():
                del wanted[name]
                squares.pop(name, None)
                continue
            total = squares.setdefault(name, torch.zeros(ref.numel(), dtype=torch.float64, device=ref.device))
            for start, (o, r) in compare.chunks(other, ref, device=ref.device):
                o, r = o.double(), r.double()
                error = (o - r).square_()
                error.masked_fill_(~torch.isfinite(r), 0.0)  # a non-finite reference element: not its noise
                error.masked_fill_(torch.isfinite(r) & ~torch.isfinite(o), float("inf"))
                total[start:start + error.numel()] += error
        del outputs
    return {name: _pooled(total.div_(runs).sqrt_(), wanted[name]) for name, total in squares.items()}


def _pooled(noise: Any, reference: Any) -> Any:
    """``noise`` (flat RMS per element) with elements that are zero by structure lifted to the output's RMS
    noise, in the reference's shape."""
    import torch

    from pytest_ditgate.correctness import compare

    usable = torch.isfinite(noise)
    count = int(usable.sum())
    if count:
        rms = float(torch.where(usable, noise, 0.0).square().sum().div(count).sqrt())
        if rms > 0:
            for start, (r,) in compare.chunks(reference, device=noise.device):
                part = noise[start:start + r.numel()]
                near = r.double().abs().nan_to_num_(nan=0.0, posinf=float("inf")) <= NEAR_ZERO * rms
                part.masked_fill_(near & (part < rms), rms)
    return noise.reshape(reference.shape)
