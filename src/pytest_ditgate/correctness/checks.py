"""``check_kernel``: a candidate kernel against a higher-precision reference, with anti-gaming checks.

Per trial (fresh inputs from ``make_inputs(seed + trial)``), in this order:

1. the candidate runs first (before any reference call of that trial, so no stale reference result can
   sit in memory it allocates), with fresh allocations, freed memory, out buffers and scratch poisoned;
2. its outputs (and the in-out arguments it updated) are copied in the caller's stream order, then every CUDA
   device is synchronised (all streams) and compared with the copies: a kernel that leaves work on a side
   stream shows as ``stale_output``;
3. timing functions are checked (``timer_tampered``), inputs compared with their pre-call copy
   (``input_mutated``; the arguments declared as ``out_args``, ``inout_args`` or ``scratch_args`` may
   change, :mod:`pytest_ditgate.correctness.roles`), and the bytes of their buffers outside their views too
   (:mod:`pytest_ditgate.correctness.storage`);
4. the candidate runs again on the same inputs, in-out arguments restored and its memory poisoned with another
   pattern (``nondeterministic`` beyond the allowance; a computed NaN is told from unwritten memory);
5. the reference runs on float64 copies (float32 if float64 fails); then structure/shape, dtype, poison
   left in outputs, non-finite values, outputs equal to an earlier trial's while the reference changed
   (``constant_output``), elementwise and relative-norm error (``mismatch``), directed rounding of a 16-bit
   output over it or a block of its rows or columns (``rounding_bias``), and nondeterminism are judged,
   the first failing check giving the reason; then a returned tensor that shares memory with a read-only
   input fails ``aliased_output`` unless the reference returns a view of its input there too
   (:mod:`pytest_ditgate.correctness.aliasing`). An output beyond the dtype table's bounds is judged again
   against bounds derived from the honest-error estimate (:mod:`pytest_ditgate.correctness.honest`):
   the reference on the inputs' own dtypes (the candidate's precision, TF32 off unless declared) and on
   float64 ``|inputs|``. Those two runs are made only then, and on the first trial (whose same-precision
   run gives the output dtypes the candidate must return). An output that still fails is judged once more
   with the conditioning of the problem measured (:mod:`pytest_ditgate.correctness.conditioning`).

Once per call, on the last trial or on a trial that failed its bound, the precision probe runs the candidate
and the reference again on the trial's inputs moved within the cells of a coarser rounding grid
(:mod:`pytest_ditgate.correctness.precision_probe`): an output that stays exactly the same where an honest
kernel's would change fails as ``precision_downgrade``.

After the trials, one extremal trial per input scale (:mod:`pytest_ditgate.correctness.scales`). Outputs are
compared in chunks and earlier outputs kept as fingerprints, so the gate's own memory stays a few times
the inputs (:mod:`pytest_ditgate.correctness.memory`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from pytest_ditgate.arguments import (callable_name, clip, describe, positional_arity_error, raised_by,
                                      require_callable, require_int, require_number)
from pytest_ditgate.correctness import (aliasing, compare, conditioning, expected_nonfinite, honest, memory, poison,
                                        reference_noise, rounding, scales, stepwise, storage, switches)
from pytest_ditgate.correctness.precision_probe import Probe
from pytest_ditgate.correctness.downcasts import Downcasts
from pytest_ditgate.correctness.report import KernelReport, TrialReport, failure_message
from pytest_ditgate.correctness.roles import Roles, key_name, parse_keys
from pytest_ditgate.correctness.structure import (as_call, map_tensors, named_call_tensors, named_leaves, named_tensors,
                                                   structure_of)
from pytest_ditgate.correctness.tolerances import accumulation_roundoff, rel_norm_ceiling, tolerance_for
from pytest_ditgate.dtypes import dtype_name
from pytest_ditgate.errors import DitgateResourceError, DitgateUsageError, DitgateWarning, GateFailure
from pytest_ditgate.timer_integrity import tampered_timers

_UNSUPPORTED = (RuntimeError, NotImplementedError, TypeError)


def check_kernel(
    candidate: Callable[..., Any],
    reference: Callable[..., Any],
    make_inputs: Callable[[int], Any],
    *,
    trials: int = 5,
    seed: int = 0,
    rtol: float | None = None,
    atol: float | None = None,
    rel_norm: float | None = None,
    compute_dtype: Any = None,
    reference_dtype: Any = "float64",
    out_args: Sequence[int | str] = (),
    inout_args: Sequence[int | str] = (),
    scratch_args: Sequence[int | str] = (),
    input_scales: Sequence[float | str] | None = scales.DEFAULT_SCALES,
    scaled_args: Sequence[int | str] | None = None,
    check_determinism: bool = True,
    nondeterminism_atol: float = 0.0,
    allow_nondeterminism: bool = False,
    check_constant: bool = True,
    poison_memory: bool = True,
    check_timers: bool = True,
    check_precision: bool = True,
    check_rounding: bool = True,
    nonfinite: str = "reject",
    label: str | None = None,
) -> KernelReport:
    """Check that ``candidate`` computes what ``reference`` computes; return a :class:`KernelReport`.

    ``make_inputs(seed)`` returns the arguments: a tuple (positional), a dict (keyword), ``(args, kwargs)``
    or one tensor. Trial ``i`` uses seed ``seed + i``. Outputs may be a tensor or nested tuples/lists/dicts
    of tensors (``None`` entries allowed; any other value is a usage error). ``reference_dtype``:
    ``"float64"`` (default; falls back to float32 when the reference fails in float64), ``"float32"``, or
    ``None``/``"same"`` to run the reference on the inputs' dtypes.
    Tolerances come from :func:`tolerance_for` on each output's dtype (or ``compute_dtype``, e.g.
    ``"tf32"``), overridden by ``rtol``/``atol``/``rel_norm``. Arguments are named by positional index or
    keyword: ``out_args`` are output buffers the kernel writes (poisoned before each call; the kernel's
    outputs when it returns None); ``inout_args`` are read and updated in place (each call gets the pristine
    values; compared after the call with the reference's updated copy); ``scratch_args`` are workspaces whose
    contents on entry are unspecified (poisoned before each call, not compared). ``input_scales``: one extremal trial per entry after the
    ``trials`` (inputs scaled by a number, or ``"mixed"`` per row; ``()`` for none), scaling the floating
    arguments ``scaled_args`` names (default: all but ``out_args``). ``check_precision``: the precision probe
    (inputs moved within the cells of the grid next coarser than the inputs' dtype, or than ``compute_dtype``;
    an output that does not respond fails ``precision_downgrade``; its verdict is ``report.precision``).
    ``check_rounding``: a bfloat16 or float16 output whose deviations from the correctly rounded reference go one
    way (a truncating cast) fails ``rounding_bias`` (off when ``compute_dtype`` declares a precision).
    ``nonfinite``: ``"reject"`` (a reference that returns NaN or Inf fails ``reference_nonfinite``) or ``"match"``
    (its NaN and infinities are expected values, :mod:`pytest_ditgate.correctness.expected_nonfinite`: the
    candidate must return the same ones at the same elements, the finite ones are compared as usual). Raises
    :class:`~pytest_ditgate.GateFailure` with a stable ``.reason``.
    """
    roles = _check_arguments(candidate, reference, make_inputs, trials=trials, seed=seed, compute_dtype=compute_dtype,
                             rtol=rtol, atol=atol, rel_norm=rel_norm, label=label,
                             nondeterminism_atol=nondeterminism_atol,
                             roles=dict(out_args=out_args, inout_args=inout_args, scratch_args=scratch_args),
                             flags=dict(check_determinism=check_determinism, allow_nondeterminism=allow_nondeterminism,
                                        check_constant=check_constant, poison_memory=poison_memory,
                                        check_timers=check_timers, check_precision=check_precision,
                                        check_rounding=check_rounding))
    match_nonfinite = expected_nonfinite.parse(nonfinite, CALL)
    scale_list = scales.parse_scales(input_scales, CALL)
    if scaled_args is not None:
        scaled_args = parse_keys(scaled_args, "scaled_args", CALL)
    run = _Run(candidate, reference, make_inputs, trials=trials, seed=seed,
               tolerance=dict(rtol=rtol, atol=atol, rel_norm=rel_norm, compute_dtype=compute_dtype),
               reference_dtype=_parse_reference_dtype(reference_dtype), roles=roles,
               input_scales=scale_list, scaled_args=scaled_args,
               check_determinism=check_determinism, nondeterminism_atol=float(nondeterminism_atol),
               allow_nondeterminism=allow_nondeterminism, check_constant=check_constant,
               poison_memory=poison_memory, check_timers=check_timers, check_precision=check_precision,
               check_rounding=check_rounding and compute_dtype is None, match_nonfinite=match_nonfinite, label=label)
    return run.execute()


CALL = "kernel_check(candidate, reference, make_inputs)"


def _check_arguments(candidate: Any, reference: Any, make_inputs: Any, *, trials: Any, seed: Any, compute_dtype: Any,
                     rtol: Any, atol: Any, rel_norm: Any, label: Any, nondeterminism_atol: Any,
                     roles: dict[str, Any], flags: dict[str, Any]) -> Roles:
    """Every argument checked before any call of the user's code: a usage error names the argument."""
    require_callable(candidate, "candidate", CALL,
                     "the kernel under test, called with the arguments make_inputs returns")
    require_callable(reference, "reference", CALL, "plain PyTorch, called with float64 copies of the same arguments")
    require_callable(make_inputs, "make_inputs", CALL, "make_inputs(seed) returns the arguments of one trial")
    problem = positional_arity_error(make_inputs, 1)
    if problem is not None:
        raise DitgateUsageError(f"{CALL}: make_inputs is called with one argument, the seed, but {problem}; check "
                                "the order of the arguments: kernel_check(candidate, reference, make_inputs)")
    require_int(trials, "trials", CALL, minimum=1)
    require_int(seed, "seed", CALL)
    for name, value in (("rtol", rtol), ("atol", atol), ("rel_norm", rel_norm)):
        if value is not None:
            require_number(value, name, CALL, minimum=0)
    require_number(nondeterminism_atol, "nondeterminism_atol", CALL, minimum=0)
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise DitgateUsageError(f"{CALL}: {name} must be True or False, got {describe(value)}")
    if label is not None and not isinstance(label, str):
        raise DitgateUsageError(f"{CALL}: label must be a string, got {describe(label)}")
    parsed = Roles.parse(CALL, **roles)
    tolerance_for("float32", compute_dtype=compute_dtype, rtol=rtol, atol=atol, rel_norm=rel_norm)
    return parsed


class _UserRaised(Exception):
    """Internal: the user's reference raised ``error`` (unwrapped before it reaches the user)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


class _Skip(Exception):
    """Internal: an extremal trial outside the op's range (the reason is noted, the trial not judged)."""


def _parse_reference_dtype(value: Any) -> torch.dtype | None:
    if value is None or value == "same":
        return None
    name = dtype_name(value)
    if name not in ("float64", "float32"):
        raise DitgateUsageError(f"reference_dtype must be 'float64', 'float32', None or 'same', got {value!r}")
    return getattr(torch, name)


_callable_name = callable_name


@dataclass
class _Outputs:
    """What one call produced: its return value and the in-out arguments it updated, by name."""

    returned: Any
    inout: dict[str, torch.Tensor] = field(default_factory=dict)
    aliases: tuple[tuple[str, str], ...] = ()  # (output, read-only or scratch input) pairs sharing memory

    def named(self) -> list[tuple[str, torch.Tensor]]:
        return list(named_tensors(self.returned, "out")) + [(f"in-out {name}", t) for name, t in self.inout.items()]


class _Run:
    """One ``check_kernel`` call: its settings, the report being filled, and the state across trials."""

    def __init__(self, candidate, reference, make_inputs, *, trials, seed, tolerance, reference_dtype, roles,
                 input_scales, scaled_args, check_determinism, nondeterminism_atol, allow_nondeterminism,
                 check_constant, poison_memory, check_timers, check_precision, check_rounding, label,
                 match_nonfinite=False) -> None:
        self.candidate, self.reference, self.make_inputs = candidate, reference, make_inputs
        self.trials, self.seed, self.tolerance = trials, seed, tolerance
        self.reference_dtype, self.roles = reference_dtype, roles
        self.input_scales, self.scaled_args = input_scales, scaled_args
        self.check_determinism, self.nondeterminism_atol = check_determinism, nondeterminism_atol
        self.allow_nondeterminism, self.check_constant = allow_nondeterminism, check_constant
        self.poison_memory, self.check_timers = poison_memory, check_timers
        self.check_rounding = check_rounding
        self.match_nonfinite = match_nonfinite
        self.nonfinite_signatures: dict[int, dict[str, Any]] = {}  # per seed, at unit scale (nonfinite="match")
        checks = ["reference_nonfinite" + (" (its NaN/Inf expected: nonfinite='match')" if match_nonfinite else ""),
                  "shape", "dtype", "nonfinite", "mismatch(elementwise, rel-norm)", "input_mutated",
                  "aliased_output", "crash", "stream-order(every stream synchronised)"]
        if poison_memory:
            checks.append("stale_output(poisoned allocations)")
        if check_determinism:
            checks.append("nondeterministic" + (" (allowed)" if allow_nondeterminism else ""))
        if check_constant and trials + len(input_scales) > 1:
            checks.append("constant_output")
        if check_timers:
            checks.append("timer_tampered")
        if check_precision:
            checks.append("precision_downgrade")
        if check_rounding:
            checks.append("rounding_bias")
        if input_scales:
            checks.append("extremal trials (inputs " + ", ".join(scales.scale_text(s) for s in input_scales) + ")")
        name = label or _callable_name(candidate)
        repro = (f"check_kernel({_callable_name(candidate)}, {_callable_name(reference)}, "
                 f"{_callable_name(make_inputs)}, seed={{seed}}, trials=1{{extra}})")
        self.report = KernelReport(label=name, seed=seed, trials_requested=trials,
                                   reference_dtype=str(reference_dtype or "same as inputs").removeprefix("torch."),
                                   checks=tuple(checks), repro=repro, extremal_requested=len(input_scales))
        self.previous_outputs: list[tuple[int, dict[str, Any]]] = []
        self.expected_dtypes: list[torch.dtype] | None = None
        self.upcast_dtype = reference_dtype  # float32 once float64 failed
        self.output_bytes: list[int] = []
        self.reference_aliases: set[str] = set()  # outputs the reference returned as views of its inputs
        self.tracker = memory.Tracker()
        self.estimate: memory.Estimate | None = None
        self.phase = "before the first trial"
        self.watched_precision = False
        self.probe = Probe(enabled=check_precision, compute_dtype=tolerance["compute_dtype"], roles=roles,
                           trials=trials)
        self.report.precision = self.probe.report

    # -- the trial loop ---------------------------------------------------------------------------
    def execute(self) -> KernelReport:
        self._check_timers(None, "before the first trial")
        plan = [(index, self.seed + index, None) for index in range(self.trials)]
        plan += [(index, self.seed + index, scale) for index, scale in enumerate(self.input_scales)]
        for index, seed, scale in plan:
            try:
                self._trial(index, seed, scale)
            except _Skip:
                continue
            except (GateFailure, DitgateUsageError):
                raise
            except Exception as exc:  # noqa: BLE001 - an allocation failure becomes one clear message
                if not memory.is_out_of_memory(exc):
                    raise
                device = self._device_of(exc)
                raise DitgateResourceError(memory.resource_message(
                    self.phase, self.estimate, device, self.tracker.held(), exc)) from exc
        self.report.memory = self._memory_record()
        self.report.passed = True
        return self.report

    def _trial(self, index: int, seed: int, scale: float | str | None) -> None:
        trial = TrialReport(trial=index, seed=seed, scale=scale)
        (self.report.trials if scale is None else self.report.extremal_trials).append(trial)
        self.phase = f"while drawing the inputs of {self._where(trial)} (make_inputs)"
        args, kwargs = as_call(self._inputs(trial))
        if scale is not None:
            args, kwargs = self._scaled(trial, args, kwargs)
        outs = [t for _, t in self.roles.tensors(args, kwargs, "out_args")]
        inouts = self.roles.tensors(args, kwargs, "inout_args")
        trial.inputs = [compare.describe(n, t) for n, t in named_call_tensors(args, kwargs)]
        if self.estimate is None:
            self._check_fits(args, kwargs)
        self.phase = f"while copying the inputs of {self._where(trial)}"
        snapshot = storage.Snapshot(named_call_tensors(args, kwargs))  # layouts kept; bytes outside the views
        pristine = (map_tensors(args, snapshot.pristine), map_tensors(kwargs, snapshot.pristine))
        pristine_by_name = dict(named_call_tensors(*pristine))

        self.phase = f"after the candidate's first call ({self._where(trial)})"
        first = self._run_candidate(trial, args, kwargs, outs, inouts, "first call")
        self._check_inputs_kept(trial, (args, kwargs), pristine, snapshot, "first call")
        if first.returned is None and not inouts:
            self._fail("shape", "the candidate returned None on its first call (and no out_args or inout_args were "
                                "given)", trial, [])
        second = None
        if self.check_determinism:
            for name, tensor in inouts:
                tensor.copy_(pristine_by_name[name])
            self.phase = f"after the candidate's second call ({self._where(trial)})"
            second = self._run_candidate(trial, args, kwargs, outs, inouts, "second call on the same inputs",
                                         byte=poison.SECOND_POISON_BYTE)
            self._check_inputs_kept(trial, (args, kwargs), pristine, snapshot, "second call")
            trial.determinism_checked = True
        del args, kwargs, outs, inouts, snapshot

        self.phase = f"while running the reference on {self._copies_text(self.upcast_dtype)} ({self._where(trial)})"
        ref_out = self._run_reference(trial, pristine)
        problem = self._nonfinite_reference(ref_out)
        if problem is not None and self.match_nonfinite:
            problem = self._undeclared_nonfinite(trial, ref_out)
        if problem is not None:
            if scale is not None:
                name, ref, count, _ = problem
                self._skip(trial, f"the reference is not finite there ({count} of {ref.numel()} elements of {name})")
            self._fail_nonfinite_reference(trial, *problem)
        estimate = _Lazy(lambda: self._honest_runs(pristine, ref_out))
        if self.expected_dtypes is None:  # the same-precision run also says which dtypes the candidate must return
            self.phase = f"while running the reference's honest-error runs ({self._where(trial)})"
            estimate.get()
        if scale is not None:
            self._skip_overflowing_outputs(trial, ref_out)
        conditioned = _Conditionings(lambda roundoff=None: self._conditioning(pristine, ref_out, roundoff),
                                     lambda: stepwise.roundoff([t.dtype for _, t in named_call_tensors(*pristine)]
                                                               + list(self.expected_dtypes or [])))
        self.phase = f"while judging the outputs of {self._where(trial)}"
        try:
            self._judge(trial, first, second, ref_out, estimate, conditioned)
        except GateFailure as failure:  # a bound failed: a downgrade, if the probe finds one, says more
            if failure.reason == "mismatch" and self.probe.due(trial, failed=True) and not _gross(trial):
                self._probe(trial, pristine, first, second, ref_out, conditioned)
            raise
        self._check_aliases(trial, first)
        if self.check_constant:
            self.previous_outputs.append((index, {name: compare.fingerprint(t) for name, t in first.named()}))
        self.output_bytes = [t.numel() * t.element_size() for _, t in first.named()]
        if self.probe.due(trial, failed=False):
            self._probe(trial, pristine, first, second, ref_out, conditioned)

    def _check_inputs_kept(self, trial: TrialReport, call: tuple, pristine: tuple, snapshot: storage.Snapshot,
                           which: str) -> None:
        """``input_mutated`` for an argument the candidate changed without declaring it, and for a write into an
        argument's buffer outside its view (which no declaration allows)."""
        for (name, now), (_, before) in zip(named_call_tensors(*call), named_call_tensors(*pristine)):
            if name.split("[")[0] in self.roles.writable:
                continue
            change = compare.max_difference(now, before)
            if change != 0:
                declare = ("; a kernel that writes it declares it: out_args=(...) (an output buffer, written only), "
                           "inout_args=(...) (compared with the reference's updated copy) or scratch_args=(...) (a "
                           "workspace: not compared)")
                self._fail("input_mutated", f"the candidate modified its input {name} ({which})", trial, [
                    f"input {name}: max change {change:.3e} (inputs must be read-only; the gate compares them "
                    "before and after the call)" + declare])
        outside = snapshot.written_outside()
        if outside is not None:
            self._fail("input_mutated", f"the candidate wrote into the buffer of {' and '.join(outside.names)} outside "
                       f"{'its view' if len(outside.names) == 1 else 'their views'} ({which})", trial,
                       outside.lines() + ["no declaration allows it: out_args, inout_args and scratch_args let a "
                                          "kernel write the elements of the view, not the memory around it"])

    def _probe(self, trial: TrialReport, pristine: tuple, first: _Outputs, second: _Outputs | None,
               ref_out: _Outputs, conditioned: "_Lazy") -> None:
        """The precision probe on this trial's inputs; fails ``precision_downgrade`` when it finds one."""
        self.phase = f"while running the precision probe ({self._where(trial)})"
        errors: dict[str, float] = {}
        for done in self.report.trials:
            for output in done.outputs:
                errors[output.name] = max(errors.get(output.name, 0.0), output.scaled_error)

        def call_candidate(args: tuple, kwargs: dict, mode: Any) -> list[tuple[str, torch.Tensor]]:
            outs = [t for _, t in self.roles.tensors(args, kwargs, "out_args")]
            inouts = self.roles.tensors(args, kwargs, "inout_args")
            return self._run_candidate(trial, args, kwargs, outs, inouts, "precision-probe call", mode=mode).named()

        def call_reference(call: tuple) -> list[tuple[str, torch.Tensor]]:
            return self._call_reference(call, self.upcast_dtype, None).named()

        try:
            self.probe.run(trial, pristine, first.named(), ref_out.named(), errors, call_candidate=call_candidate,
                           call_reference=call_reference,
                           reference_dtype=None if self.reference_dtype is None else self.upcast_dtype,
                           deterministic=second is not None and trial.nondeterminism == 0,
                           compiled=poison.looks_compiled(self.candidate),
                           noise=lambda: conditioned.get().elementwise, own_noise=self._reference_noise)
        except _UserRaised as raised:
            self.probe.report.status = "inconclusive"
            self.probe.report.notes.append(f"the reference raised {type(raised.error).__name__} on the moved inputs: "
                                           "not judged")
        failure = self.probe.failure()
        if failure is not None:
            headline, details, output = failure
            self._fail("precision_downgrade", headline, trial, details, output=output)

    # -- running the user's code ------------------------------------------------------------------
    def _where(self, trial: TrialReport) -> str:
        if trial.scale is None:
            return f"trial {trial.trial + 1} of {self.trials}, seed {trial.seed}"
        return (f"extremal trial {trial.trial + 1} of {len(self.input_scales)} (inputs "
                f"{scales.scale_text(trial.scale)}), seed {trial.seed}")

    def _inputs(self, trial: TrialReport) -> Any:
        """``make_inputs(seed)``; its exception is reported as its own, and inputs with no tensor in them are
        a usage error (nothing would be checked)."""
        seed = trial.seed
        try:
            inputs = self.make_inputs(seed)
        except Exception as exc:
            hint = ""
            if isinstance(exc, (TypeError, AttributeError)):
                hint = ("; make_inputs is called with one int, the seed: if this function is your reference or "
                        "your kernel, the arguments are in the wrong order: kernel_check(candidate, reference, "
                        "make_inputs)")
            raised_by(exc, f"make_inputs `{_callable_name(self.make_inputs)}`({seed}) ({self._where(trial)})" + hint)
            raise
        args, kwargs = as_call(inputs)
        if not named_call_tensors(args, kwargs):
            raise DitgateUsageError(
                f"{CALL}: make_inputs({seed}) returned {describe(inputs)}, with no tensor in it: make_inputs must "
                "return the kernel's arguments (a tuple, a dict, (args, kwargs) or one tensor), with its tensors "
                "drawn from the seed; check the order of the arguments")
        return inputs

    def _scaled(self, trial: TrialReport, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """The trial's inputs at its scale (out buffers and arguments outside ``scaled_args`` unscaled)."""
        skip = {key_name(key) for key in self.roles.out}
        wanted = {key_name(key) for key in self.scaled_args} if self.scaled_args is not None else None

        def scale_it(name: str) -> bool:
            return name not in skip and (wanted is None or name in wanted)

        try:
            return (scales.scaled(args, trial.scale, trial.seed, scale_it),
                    scales.scaled(kwargs, trial.scale, trial.seed, scale_it))
        except OverflowError as exc:
            self._skip(trial, str(exc))

    def _skip(self, trial: TrialReport, why: str) -> None:
        trial.skipped = why
        self.report.notes.append(f"{self._where(trial)} skipped: {why} (input_scales= declares the scales an op "
                                 "is valid at)")
        raise _Skip(why)

    def _check_fits(self, args: tuple, kwargs: dict) -> None:
        """On the first trial: the memory a trial needs, against what the inputs' devices have free."""
        itemsize = None if self.reference_dtype is None else self.reference_dtype.itemsize
        self.estimate = memory.estimate((args, kwargs), itemsize)
        devices = {t.device for _, t in named_call_tensors(args, kwargs)}
        self.tracker.watch(devices)
        for device in devices:
            free, _ = memory.free_bytes(device)
            if free is not None and self.estimate.needed > free:
                raise DitgateResourceError(memory.resource_message(
                    "before the first trial (estimated from the inputs)", self.estimate, device, self.tracker.held()))

    def _device_of(self, exc: BaseException) -> Any:
        for device in self.tracker.devices:
            if str(device) in str(exc) or str(getattr(device, "index", "")) in str(exc):
                return device
        return self.tracker.devices[0] if self.tracker.devices else torch.device("cpu")

    def _memory_record(self) -> dict[str, Any]:
        record: dict[str, Any] = self.estimate.to_dict() if self.estimate is not None else {}
        peaks = self.tracker.peaks()
        if peaks:
            record["devices"] = peaks
        return record

    # -- running the two sides --------------------------------------------------------------------
    def _check_aliases(self, trial: TrialReport, first: _Outputs) -> None:
        """``aliased_output`` for a returned tensor that shares memory with a read-only input, where no run of
        the reference so far returned a view of its input there, or with a scratch argument (always)."""
        scratch = {key_name(key) for key in self.roles.scratch}
        for output, source in first.aliases:
            if source in scratch:
                headline, details = aliasing.scratch_returned(output, source)
                self._fail("aliased_output", headline, trial, details)
            if output not in self.reference_aliases:
                self._fail("aliased_output", f"{output} is a view of the candidate's read-only input {source} "
                           "(first call)", trial, [
                               f"{output} shares memory with {source}, while the reference returns a new tensor: the "
                               f"caller's next write into {source} changes {output}, and a write into {output} changes "
                               f"{source}", "return a copy (.clone()); a kernel meant to write its result into that "
                               "argument declares it: out_args=(...) or inout_args=(...)"])

    def _readonly(self, args: tuple, kwargs: dict) -> list[tuple[str, torch.Tensor]]:
        """The call's tensor arguments the kernel may not write (no ``out_args``/``inout_args``/``scratch_args``)."""
        writable = self.roles.writable
        return [(name, t) for name, t in named_call_tensors(args, kwargs) if name.split("[")[0] not in writable]

    def _run_candidate(self, trial: TrialReport, args: tuple, kwargs: dict, outs: list,
                       inouts: list[tuple[str, torch.Tensor]], which: str, mode: Any = None,
                       byte: int = poison.POISON_BYTE) -> _Outputs:
        """One call of the candidate, its memory poisoned with ``byte`` bytes: the scratch arguments always
        (their contents on entry are unspecified), the out buffers, fresh allocations and freed memory unless
        ``poison_memory=False``."""
        devices = {t.device for _, t in named_call_tensors(args, kwargs)}
        for _, workspace in self.roles.tensors(args, kwargs, "scratch_args"):
            poison.fill_view(workspace, byte)
        if self.poison_memory:
            sizes = [t.numel() * t.element_size() for _, t in named_call_tensors(args, kwargs)] + self.output_bytes
            poison.poison_free_memory(devices, sizes, byte=byte)
            for buffer in outs:
                poison.fill_view(buffer, byte)
        use_mode = self.poison_memory and (poison.MODE_LETS_COMPILED_CODE_RUN or not poison.looks_compiled(self.candidate))
        poisoning = poison.PoisonEmpty(byte) if use_mode else contextlib.nullcontext()
        try:
            self.probe.switches.note(switches.read())
            with poisoning, mode if mode is not None else contextlib.nullcontext():
                result = self.candidate(*args, **kwargs)
            self.probe.switches.note(switches.read())
            if result is None and outs:
                result = outs[0] if len(outs) == 1 else tuple(outs)
            ordered = _Outputs(map_tensors(result, _snapshot),  # in the caller's stream order
                               {name: _snapshot(t) for name, t in inouts},
                               aliasing.overlaps(named_tensors(result, "out"), self._readonly(args, kwargs)
                                                 + self.roles.tensors(args, kwargs, "scratch_args")))
            cuda = {t.device for _, t in named_tensors(result, "out") if t.is_cuda} | \
                {d for d in devices if d.type == "cuda"}
            self._check_timers(trial, f"after the candidate's {which}")
            for device in cuda:
                torch.cuda.synchronize(device)  # waits for every stream on the device
            settled = _Outputs(result, dict(inouts)) if cuda else ordered
        except GateFailure:
            raise
        except Exception as exc:  # noqa: BLE001 - any exception inside the candidate is the crash verdict
            raised_by(exc, f"the candidate `{_callable_name(self.candidate)}` on its {which} ({self._where(trial)})")
            details = [clip(f"{type(exc).__name__}: {exc}")]
            if memory.is_out_of_memory(exc):
                held = self.tracker.held()
                details.append("the check held " + (", ".join(f"{v / memory.GB:.2f} GB on {k}" for k, v in held.items())
                                                    or "its inputs and their pristine copy") + " when the candidate ran")
            self._fail("crash", f"the candidate raised {type(exc).__name__} on its {which}", trial, details, cause=exc)
        for (name, now), (_, then) in zip(settled.named(), ordered.named()):
            if compare.max_difference(now, then) != 0:
                self._fail("stale_output", f"{name} changed after the candidate returned ({which})", trial, [
                    f"{name} read in the caller's stream order differs from {name} after synchronising every "
                    "stream: work was left running on another stream, not ordered before the caller's stream"])
        return ordered

    def _run_reference(self, trial: TrialReport, pristine: tuple) -> _Outputs:
        """The reference on upcast copies (float32 when it fails in float64 with an unsupported-dtype kind of
        error). Its own exception is raised as the reference's, once, never chained through the retry."""
        dtype = self.reference_dtype
        watch = self._precision_watch(dtype)
        out, error = self._try_reference(pristine, dtype, trial, watch)
        copies = self._copies_text(dtype)
        if error is not None and dtype == torch.float64 and isinstance(error, _UNSUPPORTED):
            out, retry = self._try_reference(pristine, torch.float32, trial, None)
            if retry is None:
                self.upcast_dtype = torch.float32
                self.report.reference_dtype = f"float32 (float64 failed: {type(error).__name__})"
                error = None
            elif type(retry) is type(error) and str(retry) == str(error):
                copies = "float64 copies of the inputs (float32 copies raised the same)"
            else:
                copies = (f"float32 copies of the inputs, after float64 copies raised "
                          f"{clip(f'{type(error).__name__}: {error}', 120)}")
                error = retry
        if error is not None:
            raised_by(error, f"the reference `{_callable_name(self.reference)}` on {copies} "
                             f"({self._where(trial)}): fix the reference (or make_inputs)")
            raise error
        if watch is not None and self.upcast_dtype == torch.float64:
            note = watch.describe()
            if note is not None:
                self.report.notes.append(note)
                warnings.warn(DitgateWarning(f"kernel_check {self.report.label!r}: {note}"), stacklevel=4)
        _require_tensor_outputs(out.returned, none_allowed=bool(out.inout))
        return out

    def _copies_text(self, dtype: torch.dtype | None) -> str:
        return f"{str(dtype).removeprefix('torch.')} copies of the inputs" if dtype is not None else "the inputs"

    def _precision_watch(self, dtype: torch.dtype | None) -> Downcasts | None:
        """The float64 run of the first trial is watched for conversions to float32 (not a compiled
        reference: a dispatch mode would run it eagerly)."""
        if self.watched_precision or dtype != torch.float64 or poison.looks_compiled(self.reference):
            return None
        self.watched_precision = True
        return Downcasts()

    def _try_reference(self, pristine: tuple, dtype: torch.dtype | None, trial: TrialReport,
                       mode: Any = None) -> tuple[Any, Any]:
        """``(outputs, None)``, or ``(None, the exception the reference raised)``."""
        try:
            return self._call_reference(pristine, dtype, trial, mode=mode), None
        except _UserRaised as raised:
            return None, raised.error

    def _nonfinite_reference(self, out: _Outputs) -> tuple[str, torch.Tensor, int, tuple[int, ...]] | None:
        """The first output where the reference is NaN/Inf: ``(name, output, count, first index)``."""
        for name, ref in out.named():
            if not compare.is_inexact(ref):
                continue
            count, where = compare.first_where(ref, lambda chunk, _: ~torch.isfinite(chunk))
            if count:
                return name, ref, count, where
        return None

    def _undeclared_nonfinite(self, trial: TrialReport,
                              ref_out: _Outputs) -> tuple[str, torch.Tensor, int, tuple[int, ...]] | None:
        """Under ``nonfinite="match"``: an output non-finite on every element is still ``reference_nonfinite``
        (nothing left to compare); an extremal trial whose reference is non-finite elsewhere than at unit scale
        is skipped (overflow, not the op's structure). Returns the problem to fail with, or None."""
        named = ref_out.named()
        for name, ref in named:
            if expected_nonfinite.all_nonfinite(ref):
                return name, ref, ref.numel(), (0,) * ref.dim()
        if trial.scale is None:
            self.nonfinite_signatures[trial.seed] = expected_nonfinite.signature(named)
            return None
        unscaled = self.nonfinite_signatures.get(trial.seed)
        if unscaled is None:  # a seed no unit-scale trial drew: the reference on its unscaled inputs
            self.phase = f"while running the reference on the unscaled inputs of {self._where(trial)}"
            unscaled = expected_nonfinite.signature(self._call_reference(
                as_call(self._inputs(trial)), self.upcast_dtype, None).named())
        if expected_nonfinite.signature(named) != unscaled:
            self._skip(trial, "the reference is non-finite elsewhere than on the same inputs at unit scale (the "
                              "values nonfinite='match' declares are the op's structure, which a scale does not move)")
        return None

    def _fail_nonfinite_reference(self, trial: TrialReport, name: str, ref: torch.Tensor, count: int,
                                  where: tuple[int, ...]) -> None:
        """A reference that returns NaN or Inf checks nothing there (a candidate returning the same NaN would
        pass): the test's bug, reported as ``reference_nonfinite`` with the first such index, never a pass."""
        copies = self._copies_text(self.upcast_dtype)
        fix, advice = expected_nonfinite.advice(name, ref, declared=self.match_nonfinite)
        self._fail("reference_nonfinite", f"the REFERENCE `{_callable_name(self.reference)}` returned "
                   f"NaN/Inf in {name} ({fix})", trial, [
                       f"{count} of {ref.numel()} elements of the reference's {name} "
                       f"{dtype_name(ref.dtype)}{list(ref.shape)} are non-finite, computed on {copies}; first "
                       f"at index {where}: {_num(ref[where])}", *advice], output=name)

    def _skip_overflowing_outputs(self, trial: TrialReport, ref_out: _Outputs) -> None:
        """An extremal trial whose exact output does not fit the dtype the candidate returns is outside the
        op's range in that dtype."""
        for (name, ref), expected in zip(ref_out.named(), self.expected_dtypes or []):
            if expected.is_floating_point and expected != torch.float64 and \
                    compare.gap_norm(ref, ref, cast=expected) is None:
                self._skip(trial, f"the reference's {name} overflows {dtype_name(expected)}")

    def _honest_runs(self, pristine: tuple, ref_out: _Outputs) -> "_Estimate":
        """The reference at the candidate's precision and on float64 ``|inputs|`` (for the honest-error
        estimate); the first also gives the expected output dtypes. A run that fails is left out, with why."""
        if self.reference_dtype is None:  # the reference already ran at the inputs' precision
            if self.expected_dtypes is None:
                self.expected_dtypes = [t.dtype for _, t in ref_out.named()]
            return _Estimate(None, None, ("reference run in the inputs' dtypes: table bounds only",), None)
        declared = dtype_name(self.tolerance["compute_dtype"]) if self.tolerance["compute_dtype"] is not None else None
        notes: list[str] = []
        with honest.candidate_precision(tf32=declared == "tf32",
                                        reduced_precision_reduction=declared in ("float16", "bfloat16")):
            same = self._optional_run(pristine, None, "same-precision", notes, (GateFailure,))
        if self.expected_dtypes is None:
            self.expected_dtypes = self._native_dtypes(pristine, ref_out, same)
        # a reference may reject |inputs| in any way; the estimate then omits it. A magnitude needs no float64
        # (half the memory): float32 unless the inputs are float64
        wide = any(t.dtype in (torch.float64, torch.complex128) for _, t in named_call_tensors(*pristine))
        magnitude = self._optional_run(pristine, self.upcast_dtype if wide else torch.float32, "|inputs|", notes,
                                       (Exception,), transform=_magnitude)
        floating = sum(t.numel() for _, t in named_call_tensors(*pristine) if t.is_floating_point())
        return _Estimate(same, magnitude, tuple(notes), floating)

    def _conditioning(self, pristine: tuple, ref_out: _Outputs, stepwise_roundoff: float | None = None
                      ) -> conditioning.Conditioning:
        """Each output's rel-norm error with roundings simulated in the reference (Monte Carlo arithmetic),
        at the accumulator's unit roundoff (fp32's unless every output is float64), or op by op at
        ``stepwise_roundoff`` (:mod:`stepwise`: the results of the ops only, since the inputs are exact)."""
        if self.reference_dtype is None:
            return conditioning.Conditioning()
        named = ref_out.named()
        dtypes = self.expected_dtypes or [t.dtype for _, t in named]
        roundoff = stepwise_roundoff
        if roundoff is None:
            roundoff = max((accumulation_roundoff(d) for d in dtypes if d.is_floating_point or d.is_complex),
                           default=accumulation_roundoff(torch.float32))

        def run(mode: Any) -> list[tuple[str, torch.Tensor]]:
            # op by op at half precision the inputs are exact (they are of that dtype); only the results round
            transform = mode.perturb if stepwise_roundoff is None else None
            return self._call_reference(pristine, self.upcast_dtype, None, transform=transform, mode=mode).named()

        try:
            return conditioning.measure(run, dict(named), roundoff=roundoff, seed=self.seed,
                                        signs=stepwise_roundoff is not None)
        except (GateFailure, DitgateUsageError):
            raise
        except Exception as exc:  # noqa: BLE001 - the estimate does without it (out of memory included)
            if isinstance(exc, _UserRaised):
                exc = exc.error
            return conditioning.Conditioning(notes=[f"conditioning run failed ({type(exc).__name__}): not used"])

    def _reference_noise(self, call: tuple, outputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The reference's own rounding noise per element of ``outputs`` on ``call``
        (:mod:`pytest_ditgate.correctness.reference_noise`); empty when a perturbed run raises."""
        def run(mode: Any) -> list[tuple[str, torch.Tensor]]:
            return self._call_reference(call, self.upcast_dtype, None, transform=mode.perturb, mode=mode).named()

        try:
            return reference_noise.measure(run, outputs, dtype=self.upcast_dtype, seed=self.seed)
        except (GateFailure, DitgateUsageError):
            raise
        except Exception:  # noqa: BLE001 - the probe does without it (the reference raised, out of memory)
            return {}

    def _optional_run(self, pristine: tuple, dtype: torch.dtype | None, what: str, notes: list[str],
                      catch: tuple[type[BaseException], ...], transform: Callable[[Any], Any] | None = None) -> Any:
        """A reference run the estimate can do without: None (and why, in ``notes``) when the reference raises
        (on these dtypes or magnitudes), or the gate fails it with one of ``catch``; replaced timing functions
        still fail the gate."""
        try:
            return self._call_reference(pristine, dtype, None, transform=transform)
        except _UserRaised as raised:
            notes.append(f"{what} run failed ({type(raised.error).__name__}): not used")
            return None
        except catch as exc:
            if isinstance(exc, GateFailure) and exc.reason == "timer_tampered":
                raise
            notes.append(f"{what} run failed ({type(exc).__name__}): not used")
            return None

    def _call_reference(self, pristine: tuple, dtype: torch.dtype | None, trial: TrialReport | None,
                        transform: Callable[[Any], Any] | None = None, mode: Any = None) -> _Outputs:
        """The reference on fresh copies of the pristine inputs (in ``dtype``; ``transform`` applied; under the
        dispatch ``mode`` when given). The main run (``trial`` given) checks that the reference leaves its
        read-only inputs alone."""
        def prepare(t: torch.Tensor) -> torch.Tensor:
            copy = compare.upcast(t, dtype)
            return transform(copy) if transform is not None else copy

        args, kwargs = (map_tensors(part, prepare) for part in pristine)
        try:
            with mode if mode is not None else contextlib.nullcontext():
                out = self.reference(*args, **kwargs)
        except Exception as exc:  # the reference's own error: the caller decides how it is reported
            raise _UserRaised(exc) from None
        outs = [t for _, t in self.roles.tensors(args, kwargs, "out_args")]
        if out is None and outs:
            out = outs[0] if len(outs) == 1 else tuple(outs)
        inout = {name: t.detach() for name, t in self.roles.tensors(args, kwargs, "inout_args")}
        if trial is not None:
            for (name, now), (_, then) in zip(named_call_tensors(args, kwargs), named_call_tensors(*pristine)):
                if name.split("[")[0] in self.roles.writable or any(now is o for o in outs):
                    continue
                if compare.max_difference(now, then, cast=True) != 0:
                    self._fail("input_mutated", f"the REFERENCE modified its input {name} (fix the reference, or "
                               "declare it in out_args / inout_args / scratch_args)", trial, [])
        found = aliasing.overlaps(named_tensors(out, "out"), self._readonly(args, kwargs))
        self.reference_aliases.update(output for output, _ in found)
        out = map_tensors(out, lambda t: t.detach())
        for device in {t.device for _, t in named_tensors((out, inout), "out") if t.is_cuda}:
            torch.cuda.synchronize(device)
        self._check_timers(trial, "after the reference")
        return _Outputs(out, inout)

    @staticmethod
    def _native_dtypes(pristine: tuple, upcast_out: _Outputs, native: _Outputs | None) -> list[torch.dtype]:
        """Output dtypes of the reference on the inputs' own dtypes (what the candidate must return); the
        promoted floating input dtype when that run failed (an in-out argument keeps its own dtype)."""
        if native is not None:
            return [t.dtype for _, t in native.named()]
        floats = [t.dtype for _, t in named_call_tensors(*pristine) if t.is_floating_point()]
        promoted = floats[0] if floats else None
        for dt in floats[1:]:
            promoted = torch.promote_types(promoted, dt)
        by_name = dict(named_call_tensors(*pristine))
        dtypes = [promoted if (promoted is not None and t.is_floating_point()) else t.dtype
                  for _, t in named_tensors(upcast_out.returned, "out")]
        return dtypes + [by_name[name].dtype for name in upcast_out.inout]

    # -- judging one trial ------------------------------------------------------------------------
    def _judge(self, trial: TrialReport, first: _Outputs, second: _Outputs | None, ref_out: _Outputs,
               estimate: "_Lazy", conditioned: "_Lazy") -> None:
        if structure_of(first.returned) != structure_of(ref_out.returned):
            loose = [name for name, value in named_leaves(first.returned, "out")
                     if value is not None and not isinstance(value, torch.Tensor)]
            hint = ([f"kernel_check compares torch tensors: {loose[0]} is not one; return a torch.Tensor (several "
                     "outputs as a tuple, list or dict of tensors)"] if loose else [])
            self._fail("shape", "the candidate's outputs are structured differently from the reference's", trial,
                       [f"the candidate returned {describe(first.returned)}",
                        f"the reference returned {describe(ref_out.returned)}", *hint])
        pairs = list(zip(first.named(), ref_out.named(), self.expected_dtypes or []))
        for (name, cand), (_, ref), expected in pairs:
            if cand.shape != ref.shape:
                self._fail("shape", f"{name} has shape {list(cand.shape)}, the reference's has {list(ref.shape)}",
                           trial, [f"output {name}: candidate {cand.dtype} {list(cand.shape)}, reference "
                                   f"{ref.dtype} {list(ref.shape)}"])
            if expected is not None and cand.dtype != expected:
                self._fail("dtype", f"{name} is {cand.dtype}, the reference returns {expected} on these inputs",
                           trial, [f"output {name}: shape {list(cand.shape)}"])
        again = dict(second.named()) if second is not None else {}
        for (name, cand), (_, ref), _ in pairs:
            if self.poison_memory:  # without poisoning, bytes of 0xFF are a value (a NaN), not a sign of staleness
                self._judge_poison(trial, name, cand, again.get(name), ref)
            count, where = compare.nonfinite_where_reference_finite(cand, ref)
            if count:
                self._fail("nonfinite", f"{name} has NaN/Inf where the reference is finite", trial, [
                    f"{count} of {cand.numel()} elements of {name} are non-finite; first at index {where}: "
                    f"candidate {_num(cand[where])} vs reference {_num(ref[where])}"])
            if self.match_nonfinite:
                self._judge_expected_nonfinite(trial, name, cand, ref)
        structure = structure_of(ref_out.returned)
        for (name, cand), (_, ref), _ in pairs:
            keep = expected_nonfinite.finite_mask(ref) if self.match_nonfinite and \
                expected_nonfinite.has_nonfinite(ref) else None
            trial.outputs.append(self._compare(name, cand, ref, structure, estimate, conditioned, keep))
        for result, ((name, cand), _, _) in zip(trial.outputs, pairs):
            if result.passed:
                continue
            earlier = self._equal_earlier_output(name, cand) if self.check_constant else None
            if earlier is not None:
                self._fail("constant_output", f"{name} is identical to trial {earlier + 1}'s while the reference "
                           "changed with the inputs", trial, result.lines() + [
                               "the candidate returns the same output for different inputs (cached or constant)"])
            self._fail("mismatch", f"{name} differs from the reference beyond tolerance", trial, result.lines(),
                       output=name)
        if self.check_rounding:
            self._judge_rounding(trial, pairs, structure, estimate)
        if second is not None:
            self._judge_determinism(trial, first, second)

    def _judge_expected_nonfinite(self, trial: TrialReport, name: str, cand: torch.Tensor, ref: torch.Tensor) -> None:
        """Under ``nonfinite="match"``: ``mismatch`` where the reference is non-finite and the candidate does not
        hold the same value there (finite, or another infinity, or NaN)."""
        found = expected_nonfinite.mismatch(name, cand, ref)
        if found is not None:
            self._fail("mismatch", found[0], trial, found[1], output=name)

    def _judge_rounding(self, trial: TrialReport, pairs: list, structure: Any, estimate: "_Lazy") -> None:
        """``rounding_bias`` for a 16-bit output whose deviations from the correctly rounded reference go one way,
        over the whole output or a block of its rows or columns, unless the reference's own run at the inputs'
        precision errs the same way there by about as much (a shared value rounded at that precision shifts
        whole rows)."""
        for (name, cand), (_, ref), _ in pairs:
            bias = rounding.rounding_bias(cand, ref, lambda: estimate.get().outputs(structure)[0].get(name))
            if bias is None:
                continue
            where = "" if bias.region == "the whole output" else f" in {bias.region}"
            self._fail("rounding_bias", f"{name} rounds {bias.direction}{where}", trial,
                       bias.lines(name, cand.dtype), output=name)

    def _judge_poison(self, trial: TrialReport, name: str, cand: torch.Tensor, again: torch.Tensor | None,
                      ref: torch.Tensor) -> None:
        """``stale_output`` where an output holds the poison of its call: the first call's ``0xFF`` bytes where
        the second call (poisoned with ``0x7F`` bytes) does not return the same bits (a NaN the kernel computes
        and the CPU converts to ``0xFFFF`` in bfloat16 is the same in both calls), or the second call's pattern
        where the first does not hold it."""
        if cand.dtype is torch.bool:
            return
        flat_ref = ref.detach().reshape(-1)
        flat_again = again.detach().reshape(-1) if again is not None and again.shape == cand.shape \
            and again.dtype == cand.dtype else None

        def stale(chunk: torch.Tensor, start: int) -> torch.Tensor:
            ref_chunk = flat_ref[start:start + chunk.numel()].to(chunk.device, chunk.dtype)
            mask = poison.poisoned_mask(chunk) & ~poison.poisoned_mask(ref_chunk)
            if flat_again is None:
                return mask
            other = flat_again[start:start + chunk.numel()].to(chunk.device)
            second = poison.SECOND_POISON_BYTE
            return (mask & ~poison.poisoned_mask(other)) | (poison.poisoned_mask(other, second)
                                                             & ~poison.poisoned_mask(chunk, second)
                                                             & ~poison.poisoned_mask(ref_chunk, second))

        count, where = compare.first_where(cand, stale)
        if count:
            which = ("the poison pattern of its call (0xFF bytes before the first call, 0x7F before the second)"
                     if flat_again is not None else "the poison pattern (0xFF bytes)")
            computed = " (or computed from a scratch argument's contents on entry)" if self.roles.scratch else ""
            self._fail("stale_output", f"{name} has elements the candidate never wrote{computed}", trial, [
                f"{count} of {cand.numel()} elements of {name} still hold {which}, put into fresh allocations, "
                f"freed memory and out buffers before the call; first at index {where} (reference there: "
                f"{_num(ref[where])}): outputs left unwritten read stale memory (e.g. torch.empty holding an earlier "
                "result)"])

    def _compare(self, name: str, cand: torch.Tensor, ref: torch.Tensor, structure: Any, estimate: "_Lazy",
                 conditioned: "_Lazy", keep: torch.Tensor | None = None) -> Any:
        """The output against the table's bound; where it fails, against the derived one; where that fails
        too, with the problem's conditioning measured. ``keep`` (flat, or None): the elements compared, where
        the reference's non-finite values are expected (``nonfinite="match"``): the output, the honest-error
        runs and the conditioning are compared on those elements alone (every bound is computed over them),
        and the result names the worst element by its index in the whole output."""
        if keep is not None:
            result = self._compare(name, expected_nonfinite.compact(cand, keep), expected_nonfinite.compact(ref, keep),
                                   structure, expected_nonfinite.CompactedRuns(estimate, name, keep),
                                   expected_nonfinite.CompactedConditionings(conditioned, name, keep))
            return expected_nonfinite.in_whole_output(result, keep, tuple(cand.shape))
        tol = tolerance_for(cand.dtype, **self.tolerance)
        result = compare.compare_output(name, cand, ref, tol)
        # the derived bound is never below the table's, so the estimate is only needed when the table fails
        if result.passed or not compare.is_inexact(cand) or tol.exact:
            return result
        runs = estimate.get()
        same, magnitude = runs.outputs(structure)
        compute = self.tolerance["compute_dtype"]
        local = compare.local_scale(magnitude.get(name), ref)
        settings = dict(table=tol.rel_norm, roundoff=accumulation_roundoff(cand.dtype, compute),
                        ceiling=rel_norm_ceiling(cand.dtype, compute), inputs_per_output=runs.inputs_per_output(ref),
                        output_dtype=cand.dtype)
        bound = honest.estimate(ref, same.get(name), magnitude.get(name), notes=runs.notes, **settings)
        result = compare.compare_output(name, cand, ref, tol, bound, local)
        if result.passed:
            return result
        measured = conditioned.get()
        if name not in measured.relative:
            return result
        bound = honest.estimate(ref, same.get(name), magnitude.get(name), notes=runs.notes + tuple(measured.notes),
                                conditioning=measured.relative[name], **settings)
        result = compare.compare_output(name, cand, ref, tol, bound, local, measured.elementwise.get(name))
        if result.passed or name not in same:
            return result
        lifted, refused = stepwise.judge(name, cand, ref, same[name], tol, local, measured, conditioned.stepwise(),
                                         lambda op_by_op: honest.estimate(ref, same.get(name), magnitude.get(name),
                                                                          notes=runs.notes + tuple(measured.notes),
                                                                          conditioning=measured.relative[name],
                                                                          op_by_op=op_by_op, **settings))
        if refused is not None:
            result.honest = dataclasses.replace(result.honest, notes=result.honest.notes + (refused,))
        return lifted or result

    def _equal_earlier_output(self, name: str, cand: torch.Tensor) -> int | None:
        mark = compare.fingerprint(cand)
        for index, outputs in self.previous_outputs:
            if outputs.get(name) == mark:
                return index
        return None

    def _judge_determinism(self, trial: TrialReport, first: _Outputs, second: _Outputs) -> None:
        if structure_of(first.returned) != structure_of(second.returned):
            self._fail("nondeterministic", "two calls on the same inputs returned differently structured outputs",
                       trial, [f"first {describe(first.returned)}", f"second {describe(second.returned)}"])
        for (name, a), (_, b) in zip(first.named(), second.named()):
            difference = compare.max_difference(a, b)
            trial.nondeterminism = max(trial.nondeterminism, difference)
            if difference > self.nondeterminism_atol and not self.allow_nondeterminism:
                count = compare.first_where(a, _differs_from(b))[0] if a.shape == b.shape else a.numel()
                self._fail("nondeterministic", f"{name} differs between two calls on the same inputs", trial, [
                    f"max abs difference {difference:.3e} over {count} of {a.numel()} elements "
                    f"(allowance nondeterminism_atol={self.nondeterminism_atol:g}; pass allow_nondeterminism=True "
                    "or a larger nondeterminism_atol only for kernels that are nondeterministic by design, "
                    "e.g. atomics)"])

    # -- failing ----------------------------------------------------------------------------------
    def _check_timers(self, trial: TrialReport | None, when: str) -> None:
        if not self.check_timers:
            return
        tampered = tampered_timers()
        if tampered:
            self._fail("timer_tampered", f"timing functions replaced or wrapped ({when})", trial, [
                "tampered: " + ", ".join(tampered) + " (they must be the functions their modules define)"])

    def _fail(self, reason: str, headline: str, trial: TrialReport | None, details: list[str], *,
              output: str | None = None, cause: BaseException | None = None) -> None:
        self.report.passed = False
        self.report.reason = reason
        self.report.failed_trial = trial.trial if trial is not None else None
        self.report.failed_output = output
        self.report.memory = self._memory_record()
        if self.roles.scratch and reason in _SCRATCH_SHOWS_AS:
            names = ", ".join(key_name(key) for key in self.roles.scratch)
            details = [*details, f"scratch_args ({names}) hold unspecified contents on entry to every call: the gate "
                       "fills them with 0xFF bytes (NaN) before the first call and 0x7F bytes before the second; a "
                       "kernel that needs a zeroed workspace zeroes it itself, or takes it as an in-out argument "
                       "(inout_args=: make_inputs' values on entry, compared with the reference's copy after)"]
        message = failure_message(self.report, reason, headline, trial, details)
        raise GateFailure(reason, message, report=self.report) from cause


#: the failures a kernel that reads its scratch before writing it shows (their message says what scratch holds)
_SCRATCH_SHOWS_AS = frozenset({"stale_output", "nonfinite", "constant_output", "mismatch", "nondeterministic",
                               "rounding_bias"})


#: a rel-norm error at least this large is no nearer than an output of zeros: wrong, not a lower precision (the
#: probe would find such an output unmoved and call it downgraded). Zeros, a constant or noise unrelated to the
#: inputs keep their ``mismatch``; a long cumprod of bf16-rounded inputs (0.73) is still the probe's to name
GROSS_REL_NORM = 1.0


def _gross(trial: TrialReport) -> bool:
    """Whether an output of ``trial`` is wrong by at least :data:`GROSS_REL_NORM` of its norm."""
    return any(output.rel_norm >= GROSS_REL_NORM for output in trial.outputs)


class _Lazy:
    """A value made on first use (the honest-error runs of one trial, its conditioning)."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make, self._value, self._made = make, None, False

    def get(self) -> Any:
        if not self._made:
            self._value, self._made = self._make(), True
        return self._value


class _Conditionings:
    """One trial's conditioning runs, each made on first use: at the accumulator's roundoff (:meth:`get`), and
    op by op at the inputs' and outputs' half precision (:meth:`stepwise`, None where there is none)."""

    def __init__(self, measure: Callable[..., Any], stepwise_roundoff: Callable[[], float | None]) -> None:
        self._accumulator = _Lazy(measure)
        self._stepwise = _Lazy(lambda: None if (roundoff := stepwise_roundoff()) is None else
                               (roundoff, measure(roundoff)))

    def get(self) -> Any:
        return self._accumulator.get()

    def stepwise(self) -> Any:
        """``(roundoff, Conditioning)`` op by op at half precision, or None."""
        return self._stepwise.get()


class _Estimate:
    """The reference's outputs at the candidate's precision and on ``|inputs|`` (None: not run or failed)."""

    def __init__(self, same: _Outputs | None, magnitude: _Outputs | None, notes: tuple[str, ...],
                 input_elements: int | None) -> None:
        self.same, self.magnitude, self.notes = same, magnitude, notes
        self.input_elements = input_elements  # floating input elements (None: no estimate is made)

    def inputs_per_output(self, output: torch.Tensor) -> float | None:
        if not self.input_elements or output.numel() == 0:
            return None
        return self.input_elements / output.numel()

    def outputs(self, structure: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """Each run's tensors by output name, only when its return value is structured as ``structure``
        (the reference's)."""
        return tuple({name: t for name, t in run.named()}
                     if run is not None and structure_of(run.returned) == structure else {}
                     for run in (self.same, self.magnitude))


def _magnitude(tensor: torch.Tensor) -> torch.Tensor:
    """``|x|`` for real floating inputs (the size of each term the reference adds), in place on a fresh copy;
    others unchanged."""
    return tensor.abs_() if tensor.is_floating_point() else tensor


def _differs_from(other: torch.Tensor) -> Callable[[torch.Tensor, int], torch.Tensor]:
    flat = other.detach().reshape(-1)

    def mask(chunk: torch.Tensor, start: int) -> torch.Tensor:
        return chunk != flat[start:start + chunk.numel()].to(chunk.device)

    return mask


def _require_tensor_outputs(out: Any, *, none_allowed: bool = False) -> None:
    """Only tensors are compared: a reference output with no tensor, or with other values beside its tensors
    (a Python number, a bool), would leave those values unchecked, so it is a usage error (None is allowed;
    no tensor at all only when in-out arguments are the outputs)."""
    leaves = list(named_leaves(out, "out"))
    loose = [f"{name} ({type(value).__name__})" for name, value in leaves
             if value is not None and not isinstance(value, torch.Tensor)]
    if loose or not (none_allowed or any(isinstance(value, torch.Tensor) for _, value in leaves)):
        raise DitgateUsageError(
            "kernel_check compares tensor outputs only, but the reference returned "
            + (f"non-tensor values {', '.join(loose)}" if loose else "no tensor")
            + ": nothing would check them; return them as tensors (nested in tuples/lists/dicts)")


def _snapshot(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().clone()


def _num(value: torch.Tensor) -> str:
    item = value.item() if value.dtype.itemsize > 1 or not value.is_floating_point() else value.float().item()
    return f"{item:.6g}" if isinstance(item, float) else str(item)
