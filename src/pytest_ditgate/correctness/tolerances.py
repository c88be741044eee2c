"""Per-dtype tolerances for comparing a kernel's output with a float64 reference. Torch-free.

Each row has an elementwise bound (``|out - ref| <= atol + rtol * |ref|``, as in
``torch.testing.assert_close``) and a bound on the relative-norm error ``||out - ref|| / ||ref||``. The
norm bound is what makes zeros, constants and scaled outputs fail whatever the elementwise slack.

Rationale of the numbers: rtol is ``torch.testing.assert_close``'s default (fp64, fp32, fp16, bf16), which
a single rounding of the exact result always meets. atol is assert_close's default for fp64/fp32; for the
16-bit and 8-bit types it is about half an ulp at magnitude 4, because a kernel that legitimately
computes in the low dtype rounds intermediates as large as the output, and against a float64 reference
(unlike a same-precision one) that rounding shows up where the result cancels to near zero. The table's
atol is in units of the output's mean magnitude (``Tolerance.atol_relative``): an absolute 1.6e-2 passed
any bf16 output whose elements were all smaller (a cross-entropy gradient of 1e-9..3e-4). The norm bounds
sit a few times above the RMS error of honest rounding and well below the 1 % of a scaled output.

The table is a floor, not the whole rule: ``check_kernel`` widens the norm bound to what the computation
itself makes honest kernels err by (:class:`HonestRule`, docs/kernel_check.md), never past
:data:`REL_NORM_CEILING` unless the output's conditioning or its dtype's representability lifts it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from pytest_ditgate.dtypes import dtype_name
from pytest_ditgate.errors import DitgateUsageError
from pytest_ditgate.numbers import finite_number


@dataclass(frozen=True)
class Tolerance:
    """Elementwise ``rtol``/``atol`` and the relative-norm bound ``rel_norm`` for one dtype.

    ``atol_relative``: the table's ``atol`` is in units of the output's mean magnitude (the rounding of
    intermediates as large as the output); an ``atol`` the caller gives is absolute.
    """

    rtol: float
    atol: float
    rel_norm: float
    atol_relative: bool = True

    @property
    def exact(self) -> bool:
        return self.rtol == 0 and self.atol == 0 and self.rel_norm == 0

    def override(self, *, rtol: float | None = None, atol: float | None = None,
                 rel_norm: float | None = None) -> "Tolerance":
        """This tolerance with the given fields replaced (``None`` keeps the table's value)."""
        changes = {k: v for k, v in (("rtol", rtol), ("atol", atol), ("rel_norm", rel_norm)) if v is not None}
        for key, value in changes.items():
            if not finite_number(value) or value < 0:  # a NaN bound would pass everything
                raise DitgateUsageError(f"{key} must be >= 0 (a finite number), got {value!r}")
        fields: dict[str, Any] = {k: float(v) for k, v in changes.items()}
        if "atol" in fields:
            fields["atol_relative"] = False
        return replace(self, **fields)

    def __str__(self) -> str:
        if self.exact:
            return "exact"
        atol = f"{self.atol:.1e}" + (" x mean|ref|" if self.atol_relative else "")
        return f"rtol={self.rtol:.1e} atol={atol} rel-norm<={self.rel_norm:.1e}"


EXACT = Tolerance(0.0, 0.0, 0.0, atol_relative=False)

#: dtype name (:mod:`pytest_ditgate.dtypes`) -> tolerance against a float64 reference
TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(rtol=1e-7, atol=1e-7, rel_norm=1e-10),
    "float32": Tolerance(rtol=1.3e-6, atol=1e-5, rel_norm=3e-5),
    # fp32 output of tf32 math (10-bit mantissa inputs): select with compute_dtype="tf32"
    "tf32": Tolerance(rtol=2e-3, atol=2e-3, rel_norm=2e-3),
    "float16": Tolerance(rtol=1e-3, atol=2e-3, rel_norm=2e-3),
    "bfloat16": Tolerance(rtol=1.6e-2, atol=1.6e-2, rel_norm=8e-3),
    "float8_e4m3fn": Tolerance(rtol=1.25e-1, atol=6.25e-2, rel_norm=6e-2),
    "float8_e4m3fnuz": Tolerance(rtol=1.25e-1, atol=6.25e-2, rel_norm=6e-2),
    "float8_e5m2": Tolerance(rtol=2.5e-1, atol=1.25e-1, rel_norm=1.2e-1),
    "float8_e5m2fnuz": Tolerance(rtol=2.5e-1, atol=1.25e-1, rel_norm=1.2e-1),
    "complex128": Tolerance(rtol=1e-7, atol=1e-7, rel_norm=1e-10),
    "complex64": Tolerance(rtol=1.3e-6, atol=1e-5, rel_norm=3e-5),
}
#: the derived relative-norm bound never exceeds this (stays below the smallest wrong scaling meant to fail:
#: 0.1 % in fp32, 2 % in fp16/bf16), whatever a degenerate reference makes the honest-error estimate
REL_NORM_CEILING: dict[str, float] = {
    "float64": 1e-7, "complex128": 1e-7,
    "float32": 2e-4, "complex64": 2e-4,
    "tf32": 4e-3, "float16": 4e-3, "bfloat16": 1.2e-2,
    "float8_e4m3fn": 0.12, "float8_e4m3fnuz": 0.12, "float8_e5m2": 0.24, "float8_e5m2fnuz": 0.24,
}

#: unit roundoff (half an ulp at 1) of the dtype a kernel accumulates in
UNIT_ROUNDOFF: dict[str, float] = {
    "float64": 2.0 ** -53, "complex128": 2.0 ** -53, "float32": 2.0 ** -24, "complex64": 2.0 ** -24,
    "tf32": 2.0 ** -11, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8,
    "float8_e4m3fn": 2.0 ** -4, "float8_e4m3fnuz": 2.0 ** -4, "float8_e5m2": 2.0 ** -3, "float8_e5m2fnuz": 2.0 ** -3,
}


@dataclass(frozen=True)
class HonestRule:
    """How the honest-error estimate widens the table (all from the reference, never from the candidate).

    ``same_precision``: factor on the rel-norm error of the reference run at the candidate's precision
    (another summation order or blocking of the same precision errs by about as much). ``magnitude``:
    factor on ``u * ||f(|x|)|| / ||f(x)||``, the leading term of the forward-error bound of a sum or dot
    product in any order (a sequential loop errs by about half of it). ``length``: factor on
    ``u * sqrt(L)``, L the input elements per output element: where a long sum's terms do not cancel
    (a norm, a sum of squares) ``|f(|x|)| = |f(x)|`` and the magnitude term misses the error's growth with
    the sum's length (a sequential fp32 sum of 262144 squares errs by about 2 u sqrt(L); the norm of them by
    half of that). ``elementwise``: an element may err by this many times the norm bound at its own
    magnitude plus its scale (the output's mean magnitude, or the size of the element's own terms from the
    ``|inputs|`` run where larger), so only *local* errors fail elementwise (a uniform error the norm bound
    accepts is not rejected element by element). ``conditioning``: factor on the rel-norm error of the
    reference run in float64 with every intermediate result perturbed by one rounding of the accumulator
    (RMS over a few runs; :mod:`pytest_ditgate.correctness.conditioning`): where the output cancels to nearly
    nothing, about what any kernel at that precision errs by, whatever its order (on RMSNorm's backward at a
    normalised dimension of 1, a Liger-style fp32 kernel reached 0.55 of 8x this over 300 seeds; 1.1 of 4x).
    It also lifts the ceiling, which is set for well-conditioned outputs. ``representable``: factor on the
    rel-norm error of the reference rounded to the output's dtype (no kernel does better: e.g. fp16 outputs
    in the subnormal range); it lifts the ceiling too.
    """

    same_precision: float = 2.0
    magnitude: float = 2.0
    length: float = 4.0
    elementwise: float = 3.0
    conditioning: float = 8.0
    representable: float = 2.0


HONEST_RULE = HonestRule()


def accumulation_roundoff(dtype: Any, compute_dtype: Any = None) -> float:
    """Unit roundoff of the precision a kernel with this output (and declared compute) dtype sums in.

    fp32 for 8-, 16- and 32-bit floating outputs and for tf32/fp8 math (their products are summed in fp32);
    fp16/bf16 only when declared as ``compute_dtype`` (a low-precision accumulator); float64 for float64.
    """
    name = dtype_name(dtype)
    declared = dtype_name(compute_dtype) if compute_dtype is not None else None
    if declared in ("float16", "bfloat16"):
        return UNIT_ROUNDOFF[declared]
    return UNIT_ROUNDOFF["float64"] if name in ("float64", "complex128") else UNIT_ROUNDOFF["float32"]


def rel_norm_ceiling(dtype: Any, compute_dtype: Any = None) -> float:
    """The largest relative-norm bound the derived rule may reach for this output (and compute) dtype."""
    name = dtype_name(compute_dtype if compute_dtype is not None else dtype)
    return REL_NORM_CEILING.get(name, REL_NORM_CEILING["float32"])


_EXACT_PREFIXES = ("int", "uint", "bool")


def tolerance_for(dtype: Any, *, compute_dtype: Any = None, rtol: float | None = None,
                  atol: float | None = None, rel_norm: float | None = None) -> Tolerance:
    """The tolerance for an output of ``dtype`` (or of the math in ``compute_dtype``, e.g. ``"tf32"``).

    Integer and bool outputs are compared exactly. Explicit ``rtol``/``atol``/``rel_norm`` override the
    table; an unknown floating dtype is a usage error rather than a silent default.
    """
    name = dtype_name(compute_dtype if compute_dtype is not None else dtype)
    if name in TOLERANCES:
        base = TOLERANCES[name]
    elif name.startswith(_EXACT_PREFIXES):
        base = EXACT
    else:
        known = ", ".join(sorted(TOLERANCES))
        raise DitgateUsageError(f"no tolerance for dtype {name!r}; known: {known}, integers and bool "
                                "(pass rtol=, atol= and rel_norm= explicitly)")
    return base.override(rtol=rtol, atol=atol, rel_norm=rel_norm)
