"""The result of a kernel check: per-output errors per trial, and the text of a failure. Torch-free.

:class:`KernelReport` is returned by ``check_kernel`` on success and attached to the ``GateFailure``
(``exc.report``) on failure, so a caller can always see every trial that ran and the errors measured.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from pytest_ditgate.correctness import tolerances
from pytest_ditgate.correctness.tolerances import HonestRule, Tolerance

#: stable reason codes, in the order the checks run within a trial (the precision probe runs once per check,
#: after the trial it probes has been judged)
REASONS = ("timer_tampered", "crash", "input_mutated", "reference_nonfinite", "shape", "dtype", "stale_output",
           "nonfinite", "constant_output", "mismatch", "rounding_bias", "nondeterministic", "aliased_output",
           "precision_downgrade")


@dataclass(frozen=True)
class TensorDesc:
    """Name, shape, dtype, strides and device of one tensor argument."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    strides: tuple[int, ...]
    contiguous: bool
    device: str

    def __str__(self) -> str:
        layout = "" if self.contiguous else f" strides {self.strides}"
        return f"{self.name} {self.dtype}{list(self.shape)}{layout} on {self.device}"


@dataclass(frozen=True)
class HonestBound:
    """The relative-norm bound one output was judged by, and the honest-error estimate behind it.

    ``same_precision``: rel-norm error of the reference run at the candidate's precision; ``magnitude``:
    ``u * ||f(|x|)|| / ||f(x)||``; ``length``: ``u * sqrt(L)`` with L the input elements per output element
    (the growth of a long sum's rounding error where its terms do not cancel); ``conditioning``: rel-norm
    error of the reference with its intermediate results perturbed by roundings (measured only where the
    other terms leave the candidate failing); ``representable``: rel-norm error of the reference rounded to
    the output's dtype; None when not run or not usable (``notes`` says why). ``bound`` is the largest of the
    table's ``rel_norm`` and the factored estimates, capped at ``cap``: the dtype's ``ceiling``, lifted by
    the conditioning and representable terms, and by the same-precision term where the reference's own run at
    the candidate's half precision fails the bound (``op_by_op``: that dtype); ``source`` names which one it is.
    """

    table: float
    same_precision: float | None = None
    magnitude: float | None = None
    length: float | None = None
    bound: float = 0.0
    source: str = "table"
    rule: HonestRule = field(default_factory=lambda: tolerances.HONEST_RULE)  # read when made, as estimate() does
    notes: tuple[str, ...] = ()
    conditioning: float | None = None
    representable: float | None = None
    ceiling: float | None = None
    cap: float | None = None
    op_by_op: str | None = None  # the half-precision dtype the reference's own run fails the bound at (stepwise)

    @classmethod
    def table_only(cls, table: float, *notes: str) -> "HonestBound":
        return cls(table=table, bound=table, notes=tuple(notes))

    def __str__(self) -> str:
        parts = [f"table {self.table:.1e}"]
        if self.same_precision is not None:
            parts.append(f"same-precision run {self.same_precision:.2e} x{self.rule.same_precision:g}")
        if self.magnitude is not None:
            parts.append(f"u*|f(|x|)|/|f(x)| {self.magnitude:.2e} x{self.rule.magnitude:g}")
        if self.length is not None:
            parts.append(f"u*sqrt(inputs per output) {self.length:.2e} x{self.rule.length:g}")
        if self.conditioning is not None:
            parts.append(f"conditioning (roundings simulated in the reference) {self.conditioning:.2e} "
                         f"x{self.rule.conditioning:g}")
        if self.representable is not None:
            parts.append(f"reference rounded to the output dtype {self.representable:.2e} x{self.rule.representable:g}")
        text = f"rel-norm bound {self.bound:.2e} from the {self.source} (honest-error estimate: {'; '.join(parts)})"
        if self.cap is not None and self.ceiling is not None and self.cap > self.ceiling:
            text += f"; ceiling {self.ceiling:.1e} lifted to {self.cap:.2e} by the output's conditioning"
            if self.op_by_op is not None:
                text += " or the reference's own run in " + self.op_by_op
        return text + "".join(f"; {note}" for note in self.notes)


@dataclass
class OutputComparison:
    """Errors of one candidate output against the reference output (both seen as float64)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    reference_dtype: str
    tolerance: Tolerance
    numel: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    rel_norm: float = 0.0
    mismatches: int = 0
    worst_index: tuple[int, ...] | None = None
    worst_candidate: float | complex | None = None
    worst_reference: float | complex | None = None
    honest: HonestBound | None = None
    elementwise_ratio: float = 0.0  # max over elements of |out - ref| / allowed
    atol_used: float | None = None  # the absolute tolerance applied (the table's atol x the output's scale)
    scale: float | None = None  # the output's mean magnitude, mean(|ref|)
    local_scale: bool = False  # elements scaled by the size of their own terms (the |inputs| run)
    conditioned: bool = False  # elements allowed their own simulated rounding error (the conditioning runs)
    #: max over elements of |out - ref| / (|ref| + mean|ref|): the error's size at each element's own scale, by
    #: which the precision probe sizes the candidate's noise
    scaled_error: float = 0.0

    def _scale_text(self) -> str:
        """The elementwise allowance's scale and absolute tolerance, as applied."""
        scale = "mean|ref|" + ("" if self.scale is None else f" = {self.scale:.3g}")
        if self.local_scale:
            scale = f"max({scale}, the size of the element's terms |f(|x|)| at the output's RMS)"
        atol = "" if self.atol_used is None else f"; atol applied {self.atol_used:.3g}"
        own = (f", or {self.honest.rule.conditioning:g} x the element's simulated rounding error"
               if self.conditioned and self.honest is not None else "")
        if own and self.honest.op_by_op is not None:
            own += (f" (with every intermediate rounded to {self.honest.op_by_op}, as op-by-op {self.honest.op_by_op} "
                    f"math does: the reference's own {self.honest.op_by_op} run fails the fp32-accumulator bound)")
        return f"scale)){own}; scale {scale}{atol}"

    def _exact_lines(self) -> list[str]:
        """An output compared exactly (integers, bools): how many elements differ and the first that does; no
        bounds or ratios, which have no meaning there."""
        out = [f"output {self.name}: candidate {self.dtype}{list(self.shape)} vs reference "
               f"{self.reference_dtype}{list(self.shape)}",
               f"{self.mismatches} of {self.numel} elements differ ({100 * self.mismatch_fraction:.2f}%): "
               f"{self.dtype} outputs are compared exactly; max abs difference {self.max_abs:.6g}"]
        if self.worst_index is not None:
            out.append(f"largest difference at index {self.worst_index}: candidate {_num(self.worst_candidate)} vs "
                       f"reference {_num(self.worst_reference)}")
        return out

    @property
    def rel_norm_bound(self) -> float:
        return self.honest.bound if self.honest is not None else self.tolerance.rel_norm

    @property
    def norm_ratio(self) -> float:
        """rel-norm error / its bound (inf when the bound is 0 and the error is not)."""
        if self.rel_norm == 0:
            return 0.0
        return self.rel_norm / self.rel_norm_bound if self.rel_norm_bound else float("inf")

    @property
    def failed_bounds(self) -> tuple[str, ...]:
        """Which bounds failed: ``"elementwise"``, ``"norm"``, both or none."""
        return tuple(name for name, bad in (("elementwise", self.mismatches > 0),
                                            ("norm", self.rel_norm > self.rel_norm_bound)) if bad)

    @property
    def mismatch_fraction(self) -> float:
        return self.mismatches / self.numel if self.numel else 0.0

    @property
    def passed(self) -> bool:
        return not self.failed_bounds

    def lines(self) -> list[str]:
        """The error figures, one fact per line, for a failure message."""
        if self.tolerance.exact:
            return self._exact_lines()
        failed = " and ".join(self.failed_bounds) or "no"
        honest = self.honest if self.honest is not None else HonestBound.table_only(self.tolerance.rel_norm)
        out = [
            f"output {self.name}: candidate {self.dtype}{list(self.shape)} vs reference "
            f"{self.reference_dtype}{list(self.shape)}",
            f"{failed} bound failed: rel-norm err {self.rel_norm:.3e} = {_ratio(self.norm_ratio)} x its bound "
            f"{self.rel_norm_bound:.2e}; worst element at {_ratio(self.elementwise_ratio)} x its allowance, "
            f"{self.mismatches} of {self.numel} elements mismatch ({100 * self.mismatch_fraction:.2f}%)",
            f"max abs err {self.max_abs:.3e}, max rel err {self.max_rel:.3e}",
            str(honest),
            f"elementwise allowance max(atol + rtol*|ref|, {honest.rule.elementwise:g} x rel-norm bound x "
            f"(|ref| + {self._scale_text()}; table {self.tolerance}",
        ]
        if self.worst_index is not None:
            out.append(f"worst at index {self.worst_index}: candidate {_num(self.worst_candidate)} vs "
                       f"reference {_num(self.worst_reference)}")
        return out


@dataclass
class TrialReport:
    """One trial: its seed, its inputs, and the comparison of each output."""

    trial: int
    seed: int
    inputs: list[TensorDesc] = field(default_factory=list)
    outputs: list[OutputComparison] = field(default_factory=list)
    candidate_first: bool = True
    determinism_checked: bool = False
    nondeterminism: float = 0.0  # max abs difference between two candidate runs on the same inputs
    scale: float | str | None = None  # an extremal trial's input scale (a factor or "mixed"); None: unit scale
    skipped: str | None = None  # why an extremal trial was not judged (outside the op's range)

    @property
    def passed(self) -> bool:
        return all(output.passed for output in self.outputs)


#: the precision probe's verdicts on an output
PROBE_STATUSES = ("responds", "precision_downgrade", "inconclusive", "out_of_scope")


@dataclass(frozen=True)
class OutputSensitivity:
    """The precision probe's verdict on one output (:mod:`pytest_ditgate.correctness.sensitivity`): ``status``
    (one of :data:`PROBE_STATUSES`) and the figures behind it.

    ``would_change``: elements where an honest kernel's output must change (the reference moved by at least
    :data:`MIN_MOVE` spacings); ``unchanged``: how many of them the candidate left exactly as they were;
    ``honest_stay``: the mean probability that an honest kernel leaves one of them; ``false_alarm``: the
    Chernoff bound on an honest kernel staying on half of them; ``gain``, ``correlation``: of the
    candidate's move against the reference's there (reported, not deciding); ``reason``: one sentence.
    """

    name: str
    status: str
    numel: int = 0
    would_change: int = 0
    unchanged: int = 0
    honest_stay: float | None = None
    false_alarm: float | None = None
    gain: float | None = None
    correlation: float | None = None
    reference_moved: int = 0
    largest_move: float | None = None  # max |dr| / q over the elements
    reason: str = ""

    def line(self) -> str:
        """One line for a report or a failure."""
        figures = ""
        if self.would_change:
            figures = (f" (unchanged on {self.unchanged} of {self.would_change} elements where an honest "
                       f"kernel's output changes")
            if self.false_alarm is not None and self.status != "responds":
                chance = f"{self.false_alarm:.1e}" if self.false_alarm > 0 else "1e-300"
                figures += f"; an honest kernel's chance of staying on half of them <= {chance}"
            if self.gain is not None:
                figures += f"; gain {self.gain:.3g}"
            if self.correlation is not None:
                figures += f", correlation {self.correlation:.3g}"
            figures += ")"
        return f"{self.name}: {self.status}{figures}" + (f": {self.reason}" if self.reason else "")


@dataclass
class PrecisionReport:
    """The precision probe of one check (:mod:`pytest_ditgate.correctness.precision_probe`).

    ``status``: ``responds`` (every output in scope changed where an honest kernel's must),
    ``precision_downgrade``, ``inconclusive`` (some output could not be judged: ``outputs`` says why),
    ``out_of_scope`` (nothing to probe: no floating input to move, or no output a move can show in), ``off``
    (``check_precision=False``) or ``not run`` (the check stopped before its probed trial). ``cells``: how
    each input was moved; ``switches``: the device libraries' reduced-precision switches during the
    candidate's calls and their effect; ``extra_calls``: the calls the probe added to the check (the candidate
    and the reference on the moved inputs, and the candidate with every switch off where one was measured).
    """

    status: str = "not run"
    trial: int | None = None
    seed: int | None = None
    compute_dtype: str | None = None
    cells: list[str] = field(default_factory=list)
    outputs: list[OutputSensitivity] = field(default_factory=list)
    switches: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extra_calls: int = 0

    def summary(self) -> str:
        """One line: the status and each output's verdict (with its reason where it is not ``responds``)."""
        if self.status in ("off", "not run"):
            return f"precision probe {self.status}" + "".join(f" ({note})" for note in self.notes)
        where = (f" (trial {self.trial + 1}, seed {self.seed}; {self.extra_calls} extra calls)"
                 if self.trial is not None else "")
        parts = [output.line() for output in self.outputs] + self.notes
        return f"precision probe {self.status}{where}: " + "; ".join(parts)


@dataclass
class KernelReport:
    """Everything ``check_kernel`` measured. ``passed``/``reason`` say how it ended."""

    label: str
    seed: int
    trials_requested: int
    reference_dtype: str
    checks: tuple[str, ...]
    repro: str
    trials: list[TrialReport] = field(default_factory=list)
    #: the extremal trials, after ``trials`` (inputs at other scales; a skipped one says why)
    extremal_trials: list[TrialReport] = field(default_factory=list)
    passed: bool = False
    reason: str | None = None
    failed_trial: int | None = None
    failed_output: str | None = None
    extremal_requested: int = 0
    #: what the check noticed beside its verdict: skipped extremal trials, a reference computing in float32
    notes: list[str] = field(default_factory=list)
    #: the memory a trial needs (estimate) and the peak each CUDA device reached during the check
    memory: dict[str, Any] = field(default_factory=dict)
    #: the precision probe: does each output respond to input moves a lower precision cannot see
    precision: PrecisionReport = field(default_factory=PrecisionReport)

    @property
    def seeds(self) -> list[int]:
        return [trial.seed for trial in self.trials]

    def _worst(self, attribute: str) -> float:
        """The largest value of an error figure over every output of every trial run."""
        return max((getattr(o, attribute) for trial in self.trials + self.extremal_trials for o in trial.outputs),
                   default=0.0)

    @property
    def max_abs_error(self) -> float:
        return self._worst("max_abs")

    @property
    def max_rel_error(self) -> float:
        return self._worst("max_rel")

    @property
    def rel_norm_error(self) -> float:
        return self._worst("rel_norm")

    @property
    def mismatch_fraction(self) -> float:
        return self._worst("mismatch_fraction")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (non-finite floats become strings)."""
        data = asdict(self)
        data.update(seeds=self.seeds, max_abs_error=self.max_abs_error, max_rel_error=self.max_rel_error,
                    rel_norm_error=self.rel_norm_error, mismatch_fraction=self.mismatch_fraction)
        return _jsonable(data)

    @property
    def peak_device_bytes(self) -> int | None:
        """The highest CUDA allocation peak any device reached during the check (None on the CPU)."""
        peaks = [d["peak_allocated_bytes"] for d in self.memory.get("devices", {}).values()]
        return max(peaks) if peaks else None

    def summary(self) -> str:
        state = "passed" if self.passed else f"FAILED [{self.reason}]"
        skipped = sum(1 for trial in self.extremal_trials if trial.skipped)
        extremal = len(self.extremal_trials)
        trials = f"{len(self.trials)} trial(s)" + (f" + {extremal} extremal ({skipped} skipped)" if extremal else "")
        text = (f"kernel_check {self.label!r} {state}: {trials}, seeds {self.seeds}, "
                f"max abs err {self.max_abs_error:.3e}, max rel err {self.max_rel_error:.3e}, "
                f"rel-norm err {self.rel_norm_error:.3e}; checks: {', '.join(self.checks)}")
        inputs, peak = self.memory.get("inputs_bytes"), self.peak_device_bytes
        if peak is not None and inputs:
            text += f"; peak device memory {peak / (1 << 30):.2f} GB ({peak / inputs:.1f}x the inputs)"
        text += f"; {self.precision.summary()}"
        return text + "".join(f"; note: {note}" for note in self.notes)


def failure_message(report: KernelReport, reason: str, headline: str, trial: TrialReport | None,
                    details: list[str]) -> str:
    """The multi-line text of a ``GateFailure``: what failed, where, the figures and a repro line."""
    where = ""
    extra = ""
    if trial is not None:
        order = "candidate ran before the reference" if trial.candidate_first else "reference ran first"
        if trial.scale is None:
            which = f"trial {trial.trial + 1} of {report.trials_requested}"
        else:
            which = (f"extremal trial {trial.trial + 1} of {report.extremal_requested}, inputs "
                     f"{_scale_text(trial.scale)}")
            extra = f", input_scales=({_scale_arg(trial.scale)},)"
        where = f" ({which}, seed {trial.seed}; {order})"
    lines = [f"kernel_check {report.label!r} failed: {reason}: {headline}{where}"]
    if trial is not None and trial.inputs:
        lines.append("inputs: " + "; ".join(str(desc) for desc in trial.inputs))
    lines.extend(details)
    lines.extend(f"note: {note}" for note in report.notes)
    lines.append(f"reference computed in {report.reference_dtype}; checks run: {', '.join(report.checks)}")
    seed = trial.seed if trial is not None else report.seed
    lines.append("repro: " + report.repro.format(seed=seed, extra=extra))
    return "\n  ".join(lines)


def _scale_text(scale: float | str) -> str:
    return "mixed (each row x 10^U(-3, 3))" if scale == "mixed" else f"x {scale:g}"


def _scale_arg(scale: float | str) -> str:
    return repr(scale) if isinstance(scale, str) else f"{scale:g}"


def _ratio(value: float) -> str:
    return f"{value:.3g}" if math.isfinite(value) else "inf"


def _num(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, complex):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value
