"""The precision probe of ``check_kernel``: does the candidate compute at the precision of its inputs?

A kernel that reads float32 inputs as bf16 (or fp16, or TF32) often passes an error bound: where its output
averages many inputs (a sum, a mean, a loss), the rounding averages away too. What it cannot do is see a
change of its inputs smaller than its own rounding grid; nor, mostly, can a kernel that reads them in full but
adds their terms in a bf16 accumulator (each rounding of the partial sum drops such a move). Once per
``check_kernel`` call, on the last trial or on a trial that failed its bound, the candidate and the float64
reference run once more, on the trial's inputs with every floating input moved within its cells of the next
coarser grid than the kernel claims (:mod:`~pytest_ditgate.correctness.resolution`,
:mod:`~pytest_ditgate.correctness.perturb`). A kernel that reads at that grid returns exactly the same output,
one that accumulates at it mostly does; :mod:`~pytest_ditgate.correctness.sensitivity` judges each output
against how an honest kernel's would change, sized from the candidate's own errors over the trials. An output
that stays fails the check as ``precision_downgrade``, whose message names both causes: the probe cannot tell
a coarse read from a coarse accumulator.

The device libraries' reduced-precision switches (:mod:`~pytest_ditgate.correctness.switches`) are
recorded across the candidate's calls; where one was on for a CUDA GEMM or convolution it affects and
``compute_dtype`` does not declare that precision, the candidate runs once more with every switch forced
off, and an output that changes fails as ``precision_downgrade`` too.

``check_precision=False`` turns the probe off (the report says ``off``). Everything the probe decides, or
cannot, is in ``KernelReport.precision`` and the report's summary line.
"""

from __future__ import annotations

from typing import Any, Callable

from pytest_ditgate.correctness import perturb, reference_noise, resolution, sensitivity, switches
from pytest_ditgate.correctness.report import OutputSensitivity, PrecisionReport, TrialReport
from pytest_ditgate.correctness.roles import Roles, key_name
from pytest_ditgate.correctness.structure import map_tensors, named_call_tensors
from pytest_ditgate.dtypes import MANTISSA_BITS, dtype_name

Named = list[tuple[str, Any]]


class Probe:
    """The probe's state over one check: whether it is due, its inputs' cells, its verdict."""

    def __init__(self, *, enabled: bool, compute_dtype: Any, roles: Roles, trials: int) -> None:
        self.enabled, self.compute_dtype, self.roles, self.trials = enabled, compute_dtype, roles, trials
        self.report = PrecisionReport(status="not run" if enabled else "off",
                                      compute_dtype=dtype_name(compute_dtype) if compute_dtype is not None else None)
        if not enabled:
            self.report.notes.append("check_precision=False")
        self.switches = switches.Switches()
        self.done = False
        self._failure: tuple[str, list[str], str | None] | None = None
        self._own_noise_note: str | None = None

    def due(self, trial: TrialReport, failed: bool) -> bool:
        """The probe runs once: on a trial that failed its bound, else on the last of the ``trials``."""
        return self.enabled and not self.done and trial.scale is None and (failed or trial.trial == self.trials - 1)

    def run(self, trial: TrialReport, pristine: tuple[tuple, dict], before: Named, ref_before: Named,
            errors: dict[str, float], *, call_candidate: Callable[[tuple, dict, Any], Named],
            call_reference: Callable[[tuple[tuple, dict]], Named], reference_dtype: Any,
            deterministic: bool, compiled: bool,
            noise: Callable[[], dict[str, Any]] | None = None,
            own_noise: Callable[[tuple[tuple, dict], dict[str, Any]], dict[str, Any]] | None = None
            ) -> PrecisionReport:
        """Probe ``trial``: ``pristine`` its inputs, ``before``/``ref_before`` the candidate's and the
        reference's outputs on them by name, ``errors`` the candidate's largest scaled error per output over
        the trials. ``call_candidate(args, kwargs, mode)`` runs the candidate on its own copies (under the
        dispatch ``mode`` when given), ``call_reference(call)`` the reference on upcast copies; each returns
        the named outputs. ``deterministic``: two calls on the same inputs gave the same outputs. ``noise()``:
        each output's per-element simulated rounding error (its conditioning), asked for only where an output
        looks downgraded: an output that cancels to nearly nothing is judged again with it as the floor of a
        move (an honest kernel's output there is as coarse as its rounding of the cancelling terms).
        ``own_noise(call, outputs)``: the reference's own rounding noise per element on ``call`` against its
        ``outputs`` there (:mod:`~pytest_ditgate.correctness.reference_noise`), asked for where an output
        still looks downgraded: a reference move within it does not count."""
        self.done = True
        report = self.report
        report.trial, report.seed = trial.trial, trial.seed
        if reference_dtype is None:
            report.status = "inconclusive"
            report.notes.append("reference_dtype='same': the reference runs at the inputs' precision, so no "
                                "exact response to compare with")
            self._judge_switches(pristine, before, call_candidate, deterministic, compiled)
            return report
        named = named_call_tensors(*pristine)
        fixed = [key_name(key) for key in self.roles.out + self.roles.scratch]
        cells = resolution.plan([(name, t.dtype) for name, t in named], self.compute_dtype, fixed=fixed)
        report.cells = [str(cell) for cell in cells]
        bits_of = {id(t): cell.bits for (_, t), cell in zip(named, cells) if cell.bits is not None}
        if not bits_of:
            report.status = "out_of_scope"
            report.notes.append("no floating input to move (or none with a coarser precision than claimed)")
            self._judge_switches(pristine, before, call_candidate, deterministic, compiled)
            return report
        moved = perturb.moved_call(pristine, bits_of)
        on_device = any(switches.library_device(t) for _, t in named)
        watch = switches.watch() if on_device and not compiled else None  # the switches act on device ops only
        report.extra_calls += 2
        after = call_candidate(*_copies(moved), watch)
        if watch is not None:
            for name, count in watch.ops.items():
                self.switches.records[name].ops += count
        ref_after = call_reference(moved)
        report.outputs = self._judge_outputs(before, after, ref_before, ref_after, errors, reference_dtype)
        floors: dict[str, Any] = {}
        if noise is not None and any(o.status == "precision_downgrade" for o in report.outputs):
            floors = noise()
            if floors:
                report.outputs = self._judge_outputs(before, after, ref_before, ref_after, errors, reference_dtype,
                                                     floors=floors)
        if own_noise is not None and any(o.status == "precision_downgrade" for o in report.outputs):
            suspects = [o.name for o in report.outputs if o.status == "precision_downgrade"]
            own = own_noise(moved, {name: t for name, t in ref_after if name in suspects})
            if own:
                report.outputs = self._judge_outputs(before, after, ref_before, ref_after, errors, reference_dtype,
                                                     floors=floors, own=own)
                cleared = [o.name for o in report.outputs if o.name in suspects and o.status != "precision_downgrade"]
                self._own_noise_note = (
                    f"the reference's own rounding noise measured on the moved inputs ({reference_noise.RUNS} runs "
                    f"of it with every result moved by {reference_noise.ROUNDOFF_ULPS:g} ulps)"
                    + (f": {', '.join(cleared)} moved within it (zero by cancellation or by structure), not "
                       "downgraded" if cleared else ""))
                report.notes.append(self._own_noise_note)
        report.status = _status([o.status for o in report.outputs])
        downgraded = report.status == "precision_downgrade"
        self._judge_switches(pristine, before, call_candidate, deterministic, compiled)  # may fail it too
        if downgraded:  # the moved inputs' verdict leads; the switches' lines are in its details
            self._failure = self._downgrade_failure(cells)
        return report

    def failure(self) -> tuple[str, list[str], str | None] | None:
        """``(headline, details, output)`` of a ``precision_downgrade`` failure, or None."""
        return self._failure

    # -- the outputs ----------------------------------------------------------------------------------
    def _judge_outputs(self, before: Named, after: Named, ref_before: Named, ref_after: Named,
                       errors: dict[str, float], reference_dtype: Any, floors: dict[str, Any] | None = None,
                       own: dict[str, Any] | None = None) -> list[OutputSensitivity]:
        if [n for n, _ in after] != [n for n, _ in before] or [n for n, _ in ref_after] != [n for n, _ in ref_before]:
            return [OutputSensitivity(
                name, "inconclusive", reason="the outputs on the moved inputs are structured otherwise")
                for name, _ in before]
        verdicts = []
        ref_bits = MANTISSA_BITS.get(dtype_name(reference_dtype), 0)
        for (name, b), (_, a), (_, rb), (_, ra) in zip(before, after, ref_before, ref_after):
            precise = ref_bits > MANTISSA_BITS.get(dtype_name(b.dtype), 0)
            verdicts.append(sensitivity.judge(name, b, a, rb, ra, scaled_error=errors.get(name, float("inf")),
                                              reference_precise=precise, floor=(floors or {}).get(name),
                                              own_noise=(own or {}).get(name)))
        return verdicts

    def _downgrade_failure(self, cells: list[resolution.Cells]) -> tuple[str, list[str], str | None]:
        output = next(o for o in self.report.outputs if o.status == "precision_downgrade")
        grids = sorted({cell.bits for cell in cells if cell.bits is not None}, reverse=True)
        grid = " / ".join(f"{resolution.grid_name(bits)}'s {bits}-bit" for bits in grids)
        headline = (f"{output.name} stays exactly the same when every floating input moves within its cells of "
                    f"{grid} grid: the candidate computes it at that precision or coarser: it reads its inputs, or "
                    "accumulates their terms, at such a precision (the probe cannot tell which)")
        details = [f"precision probe: {line}" for line in self.report.cells]
        details += [f"output {o.line()}" for o in self.report.outputs]
        if self._own_noise_note is not None:
            details.append(f"precision probe: {self._own_noise_note}")
        details.append(f"an element counts where the float64 reference moves by at least {sensitivity.MIN_MOVE:g} "
                       "spacings of the output's dtype (of its own simulated rounding error where the output cancels and that is "
                       f"coarser, and of {sensitivity.REFERENCE_NOISE_FACTOR:g} x the reference's own rounding noise "
                       "where that was measured); an honest kernel's output changes there (the figures say "
                       "how likely it is to stay; the probe fails an output only below "
                       f"{sensitivity.FALSE_ALARM:g})")
        details += [f"switch {record.line()}" for record in self.switches.records.values() if _telling(record)]
        details.append("a kernel meant to compute at a lower precision declares it: compute_dtype='tf32', "
                       "'float16' or 'bfloat16' (its inputs read, or its sums accumulated, at that precision; "
                       "probed at the next coarser grid); check_precision=False turns the probe off")
        return headline, details, output.name

    # -- the device libraries' switches --------------------------------------------------------------
    def _judge_switches(self, pristine: tuple[tuple, dict], before: Named,
                        call_candidate: Callable[[tuple, dict, Any], Named], deterministic: bool,
                        compiled: bool) -> None:
        """Each switch's effect: none on the CPU; on CUDA, where one was on for a GEMM or convolution of its
        dtype and the declaration does not cover it, the candidate once more with every switch off."""
        records = self.switches.records
        cuda_dtypes = {dtype_name(t.dtype) for _, t in named_call_tensors(*pristine) if switches.library_device(t)}
        suspects = []
        for name, dtype, _, does in switches.SWITCHES:
            record = records[name]
            if not record.on and not record.ops:
                record.effect = "off"
            elif dtype not in cuda_dtypes:
                record.effect = "no effect here (it changes only CUDA GEMMs and convolutions of " + dtype + ")"
            elif switches.covered(name, self.compute_dtype):
                record.effect = f"declared by compute_dtype={self.report.compute_dtype!r}"
            elif not compiled and record.ops == 0:
                record.effect = f"no CUDA GEMM or convolution of {dtype} ran with it on"
            else:
                suspects.append(name)
        if suspects and not deterministic:
            for name in suspects:
                records[name].effect = ("effect not measured: the candidate's outputs are not reproducible "
                                        "(determinism unchecked, or two calls differed)")
            suspects = []
        if suspects:
            self.report.extra_calls += 1
            forced = call_candidate(*_copies(pristine), switches.forced_off(dispatch=not compiled))
            changed = [(name, _changed(b, f)) for (name, b), (_, f) in zip(before, forced)]
            moved = [(name, count, total) for name, (count, total) in changed if count]
            effect = ("changes " + ", ".join(f"{name} on {count} of {total} elements" for name, count, total in moved)
                      if moved else "no effect on the outputs (the same bits with every switch off)")
            for name in suspects:
                records[name].effect = effect
            if moved:
                self.report.status = "precision_downgrade"
                names = ", ".join(s.removeprefix("torch.backends.") for s in suspects)
                output, count, total = moved[0]
                self._failure = (
                    f"{output} changes on {count} of {total} elements with {names} off: the candidate computes "
                    "below its inputs' precision through the device library's switch",
                    [f"switch {record.line()}" for record in records.values() if _telling(record)]
                    + [f"precision probe: {line}" for line in self.report.cells]
                    + ["turn the switch off around the kernel, or declare the precision it computes at "
                       "(compute_dtype='tf32' for TF32, 'float16' or 'bfloat16' for a reduction in that "
                       "precision)"], output)
        self.report.switches = self.switches.lines()
        if not cuda_dtypes and any(r.on for r in records.values()):
            self.report.notes.append("the reduced-precision switches on here change nothing on a CPU")


def _telling(record: switches.SwitchRecord) -> bool:
    """A switch worth a line in a failure: on where it can change something."""
    return (record.on or record.ops > 0) and not record.effect.startswith("no effect here")


def _status(statuses: list[str]) -> str:
    """The probe's status from its outputs': a downgrade anywhere fails; out of scope only when every output
    is; responds only when every output in scope does."""
    if "precision_downgrade" in statuses:
        return "precision_downgrade"
    in_scope = [s for s in statuses if s != "out_of_scope"]
    if not in_scope:
        return "out_of_scope"
    return "responds" if all(s == "responds" for s in in_scope) else "inconclusive"


def _copies(call: tuple[tuple, dict]) -> tuple[tuple, dict]:
    """Fresh copies of a call's tensors, layouts kept (the candidate may write its in-out arguments)."""
    from pytest_ditgate.correctness.roles import copy_like

    args, kwargs = call
    return map_tensors(args, copy_like), map_tensors(kwargs, copy_like)


def _changed(before: Any, after: Any) -> tuple[int, int]:
    """``(elements that differ, elements)`` between two outputs (NaN beside NaN counts as the same)."""
    if before.shape != after.shape or before.dtype != after.dtype:
        return before.numel() or 1, before.numel()
    if before.numel() == 0:
        return 0, 0
    a, b = before.detach().reshape(-1), after.detach().reshape(-1).to(before.device)
    same = a == b
    if a.is_floating_point() or a.is_complex():
        same |= a.isnan() & b.isnan()
    return int((~same).sum()), a.numel()
