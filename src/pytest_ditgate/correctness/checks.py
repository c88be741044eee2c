"""``check_kernel``: a candidate kernel against a higher-precision reference, with anti-gaming checks.

Per trial (fresh inputs from ``make_inputs(seed + trial)``), in this order:

1. the candidate runs first (before any reference call of that trial, so no stale reference result can
   sit in memory it allocates), with fresh allocations and freed memory poisoned;
2. its outputs are copied in the caller's stream order, then every CUDA device is synchronised (all
   streams) and the outputs read again: a kernel that leaves work on a side stream shows as
   ``stale_output``;
3. timing functions are checked (``timer_tampered``), inputs compared with their pre-call copy
   (``input_mutated``);
4. the candidate runs again on the same inputs (``nondeterministic`` beyond the allowance);
5. the reference runs on float64 copies (float32 if float64 fails); then structure/shape, dtype, poison
   left in outputs, non-finite values, outputs equal to an earlier trial's while the reference changed
   (``constant_output``), elementwise and relative-norm error (``mismatch``), and nondeterminism are
   judged, the first failing check giving the reason. An output beyond the dtype table's bounds is judged
   again against bounds derived from the honest-error estimate (:mod:`pytest_ditgate.correctness.honest`):
   the reference on the inputs' own dtypes (the candidate's precision, TF32 off unless declared) and on
   float64 ``|inputs|``. Those two runs are made only then, and on the first trial (whose same-precision
   run gives the output dtypes the candidate must return).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

import torch

from pytest_ditgate.arguments import (callable_name, clip, describe, positional_arity_error, raised_by,
                                      require_callable, require_int, require_number)
from pytest_ditgate.correctness import compare, honest, poison
from pytest_ditgate.correctness.report import KernelReport, TrialReport, failure_message
from pytest_ditgate.correctness.structure import (as_call, map_tensors, named_call_tensors, named_leaves, named_tensors,
                                                   structure_of)
from pytest_ditgate.correctness.tolerances import accumulation_roundoff, rel_norm_ceiling, tolerance_for
from pytest_ditgate.dtypes import dtype_name
from pytest_ditgate.errors import DitgateUsageError, GateFailure
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
    check_determinism: bool = True,
    nondeterminism_atol: float = 0.0,
    allow_nondeterminism: bool = False,
    check_constant: bool = True,
    poison_memory: bool = True,
    check_timers: bool = True,
    label: str | None = None,
) -> KernelReport:
    """Check that ``candidate`` computes what ``reference`` computes; return a :class:`KernelReport`.

    ``make_inputs(seed)`` returns the arguments: a tuple (positional), a dict (keyword), ``(args, kwargs)``
    or one tensor. Trial ``i`` uses seed ``seed + i``. Outputs may be a tensor or nested tuples/lists/dicts
    of tensors (``None`` entries allowed; any other value is a usage error). ``reference_dtype``:
    ``"float64"`` (default; falls back to float32 when the reference fails in float64), ``"float32"``, or
    ``None``/``"same"`` to run the reference on the inputs' dtypes.
    Tolerances come from :func:`tolerance_for` on each output's dtype (or ``compute_dtype``, e.g.
    ``"tf32"``), overridden by ``rtol``/``atol``/``rel_norm``. ``out_args`` names positional indices or
    keyword names of output buffers the kernel writes (poisoned before each call; the kernel's outputs
    when it returns None). Raises :class:`~pytest_ditgate.GateFailure` with a stable ``.reason``.
    """
    _check_arguments(candidate, reference, make_inputs, trials=trials, seed=seed, compute_dtype=compute_dtype,
                     rtol=rtol, atol=atol, rel_norm=rel_norm, out_args=out_args, label=label,
                     nondeterminism_atol=nondeterminism_atol,
                     flags=dict(check_determinism=check_determinism, allow_nondeterminism=allow_nondeterminism,
                                check_constant=check_constant, poison_memory=poison_memory, check_timers=check_timers))
    run = _Run(candidate, reference, make_inputs, trials=trials, seed=seed,
               tolerance=dict(rtol=rtol, atol=atol, rel_norm=rel_norm, compute_dtype=compute_dtype),
               reference_dtype=_parse_reference_dtype(reference_dtype), out_args=tuple(out_args),
               check_determinism=check_determinism, nondeterminism_atol=float(nondeterminism_atol),
               allow_nondeterminism=allow_nondeterminism, check_constant=check_constant,
               poison_memory=poison_memory, check_timers=check_timers, label=label)
    return run.execute()


CALL = "kernel_check(candidate, reference, make_inputs)"


def _check_arguments(candidate: Any, reference: Any, make_inputs: Any, *, trials: Any, seed: Any, compute_dtype: Any,
                     rtol: Any, atol: Any, rel_norm: Any, out_args: Any, label: Any, nondeterminism_atol: Any,
                     flags: dict[str, Any]) -> None:
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
    if isinstance(out_args, (str, bytes)) or not isinstance(out_args, (list, tuple)) or not all(
            isinstance(key, str) or (isinstance(key, int) and not isinstance(key, bool)) for key in out_args):
        raise DitgateUsageError(f"{CALL}: out_args must be a tuple of positional indices and keyword names "
                                f"(like (2,) or ('out',)), got {describe(out_args)}")
    tolerance_for("float32", compute_dtype=compute_dtype, rtol=rtol, atol=atol, rel_norm=rel_norm)


class _UserRaised(Exception):
    """Internal: the user's reference raised ``error`` (unwrapped before it reaches the user)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


def _parse_reference_dtype(value: Any) -> torch.dtype | None:
    if value is None or value == "same":
        return None
    name = dtype_name(value)
    if name not in ("float64", "float32"):
        raise DitgateUsageError(f"reference_dtype must be 'float64', 'float32', None or 'same', got {value!r}")
    return getattr(torch, name)


_callable_name = callable_name


class _Run:
    """One ``check_kernel`` call: its settings, the report being filled, and the state across trials."""

    def __init__(self, candidate, reference, make_inputs, *, trials, seed, tolerance, reference_dtype, out_args,
                 check_determinism, nondeterminism_atol, allow_nondeterminism, check_constant, poison_memory,
                 check_timers, label) -> None:
        self.candidate, self.reference, self.make_inputs = candidate, reference, make_inputs
        self.trials, self.seed, self.tolerance = trials, seed, tolerance
        self.reference_dtype, self.out_args = reference_dtype, out_args
        self.check_determinism, self.nondeterminism_atol = check_determinism, nondeterminism_atol
        self.allow_nondeterminism, self.check_constant = allow_nondeterminism, check_constant
        self.poison_memory, self.check_timers = poison_memory, check_timers
        checks = ["reference_nonfinite", "shape", "dtype", "nonfinite", "mismatch(elementwise+rel-norm vs the honest-error estimate)", "input_mutated",
                  "crash", "stream-order (all streams synchronised before comparing)"]
        if poison_memory:
            checks.append("stale_output(poisoned allocations)")
        if check_determinism:
            checks.append("nondeterministic" + (" (allowed)" if allow_nondeterminism else ""))
        if check_constant and trials > 1:
            checks.append("constant_output")
        if check_timers:
            checks.append("timer_tampered")
        name = label or _callable_name(candidate)
        repro = (f"check_kernel({_callable_name(candidate)}, {_callable_name(reference)}, "
                 f"{_callable_name(make_inputs)}, seed={{seed}}, trials=1)")
        self.report = KernelReport(label=name, seed=seed, trials_requested=trials,
                                   reference_dtype=str(reference_dtype or "same as inputs").removeprefix("torch."),
                                   checks=tuple(checks), repro=repro)
        self.previous_outputs: list[tuple[int, Any]] = []
        self.expected_dtypes: list[torch.dtype] | None = None
        self.upcast_dtype = reference_dtype  # float32 once float64 failed
        self.output_bytes: list[int] = []

    # -- the trial loop ---------------------------------------------------------------------------
    def execute(self) -> KernelReport:
        self._check_timers(None, "before the first trial")
        for index in range(self.trials):
            self._trial(index, self.seed + index)
        self.report.passed = True
        return self.report

    def _trial(self, index: int, seed: int) -> None:
        trial = TrialReport(trial=index, seed=seed)
        self.report.trials.append(trial)
        args, kwargs = as_call(self._inputs(index, seed))
        outs = self._out_buffers(args, kwargs)
        out_names = {f"arg{key}" if isinstance(key, int) else key for key in self.out_args}
        trial.inputs = [compare.describe(n, t) for n, t in named_call_tensors(args, kwargs)]
        pristine = (map_tensors(args, _snapshot), map_tensors(kwargs, _snapshot))

        first = self._run_candidate(trial, args, kwargs, outs, "first call")
        for (name, now), (_, before) in zip(named_call_tensors(args, kwargs), named_call_tensors(*pristine)):
            if name in out_names:
                continue
            change = compare.max_difference(now, before)
            if change != 0:
                self._fail("input_mutated", f"the candidate modified its input {name}", trial, [
                    f"input {name}: max change {change:.3e} (inputs must be read-only; the gate compares them "
                    "before and after the call)"])
        second = None
        if self.check_determinism:
            second = self._run_candidate(trial, args, kwargs, outs, "second call on the same inputs")
            trial.determinism_checked = True

        ref_out = self._run_reference(trial, pristine, index)
        estimate = _LazyEstimate(lambda: self._honest_runs(pristine, ref_out))
        if self.expected_dtypes is None:  # the same-precision run also says which dtypes the candidate must return
            estimate.get()
        self._judge(trial, first, second, ref_out, estimate)
        self.previous_outputs.append((index, first))
        self.output_bytes = [t.numel() * t.element_size() for _, t in named_tensors(first, "out")]

    # -- running the user's code ------------------------------------------------------------------
    def _where(self, index: int, seed: int) -> str:
        return f"trial {index + 1} of {self.trials}, seed {seed}"

    def _inputs(self, index: int, seed: int) -> Any:
        """``make_inputs(seed)``; its exception is reported as its own, and inputs with no tensor in them are
        a usage error (nothing would be checked)."""
        try:
            inputs = self.make_inputs(seed)
        except Exception as exc:
            hint = ""
            if isinstance(exc, (TypeError, AttributeError)):
                hint = ("; make_inputs is called with one int, the seed: if this function is your reference or "
                        "your kernel, the arguments are in the wrong order: kernel_check(candidate, reference, "
                        "make_inputs)")
            raised_by(exc, f"make_inputs `{_callable_name(self.make_inputs)}`({seed}) ({self._where(index, seed)})"
                      + hint)
            raise
        args, kwargs = as_call(inputs)
        if not named_call_tensors(args, kwargs):
            raise DitgateUsageError(
                f"{CALL}: make_inputs({seed}) returned {describe(inputs)}, with no tensor in it: make_inputs must "
                "return the kernel's arguments (a tuple, a dict, (args, kwargs) or one tensor), with its tensors "
                "drawn from the seed; check the order of the arguments")
        return inputs

    # -- running the two sides --------------------------------------------------------------------
    def _out_buffers(self, args: tuple, kwargs: dict) -> list[torch.Tensor]:
        buffers = []
        for key in self.out_args:
            try:
                value = args[key] if isinstance(key, int) else kwargs[key]
            except (IndexError, KeyError):
                raise DitgateUsageError(f"out_args names {key!r}, which make_inputs did not provide") from None
            if not isinstance(value, torch.Tensor):
                raise DitgateUsageError(f"out_args {key!r} is not a tensor ({type(value).__name__})")
            buffers.append(value)
        return buffers

    def _run_candidate(self, trial: TrialReport, args: tuple, kwargs: dict, outs: list, which: str) -> Any:
        devices = {t.device for _, t in named_call_tensors(args, kwargs)}
        if self.poison_memory:
            sizes = [t.numel() * t.element_size() for _, t in named_call_tensors(args, kwargs)] + self.output_bytes
            poison.poison_free_memory(devices, sizes)
            for buffer in outs:
                poison.fill_poison(buffer)
        use_mode = self.poison_memory and (poison.MODE_LETS_COMPILED_CODE_RUN or not poison.looks_compiled(self.candidate))
        mode = poison.PoisonEmpty() if use_mode else contextlib.nullcontext()
        try:
            with mode:
                result = self.candidate(*args, **kwargs)
            if result is None and outs:
                result = outs[0] if len(outs) == 1 else tuple(outs)
            ordered = map_tensors(result, _snapshot)  # in the caller's stream order
            cuda = {t.device for _, t in named_tensors(result, "out") if t.is_cuda} | \
                {d for d in devices if d.type == "cuda"}
            self._check_timers(trial, f"after the candidate's {which}")
            for device in cuda:
                torch.cuda.synchronize(device)  # waits for every stream on the device
            settled = map_tensors(result, _snapshot) if cuda else ordered
        except GateFailure:
            raise
        except Exception as exc:  # noqa: BLE001 - any exception inside the candidate is the crash verdict
            raised_by(exc, f"the candidate `{_callable_name(self.candidate)}` on its {which} "
                           f"({self._where(trial.trial, trial.seed)})")
            self._fail("crash", f"the candidate raised {type(exc).__name__} on its {which}", trial,
                       [clip(f"{type(exc).__name__}: {exc}")], cause=exc)
        if result is None:
            self._fail("shape", f"the candidate returned None on its {which} (and no out_args were given)", trial, [])
        for (name, now), (_, then) in zip(named_tensors(settled, "out"), named_tensors(ordered, "out")):
            if compare.max_difference(now, then) != 0:
                self._fail("stale_output", f"{name} changed after the candidate returned ({which})", trial, [
                    f"{name} read in the caller's stream order differs from {name} after synchronising every "
                    "stream: work was left running on another stream, not ordered before the caller's stream"])
        return ordered

    def _run_reference(self, trial: TrialReport, pristine: tuple, index: int) -> Any:
        """The reference on upcast copies (float32 when it fails in float64 with an unsupported-dtype kind of
        error). Its own exception is raised as the reference's, once, never chained through the retry."""
        dtype = self.reference_dtype
        out, error = self._try_reference(pristine, dtype, trial)
        copies = f"{str(dtype).removeprefix('torch.')} copies of the inputs" if dtype is not None else "the inputs"
        if error is not None and dtype == torch.float64 and isinstance(error, _UNSUPPORTED):
            out, retry = self._try_reference(pristine, torch.float32, trial)
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
                             f"({self._where(trial.trial, trial.seed)}): fix the reference (or make_inputs)")
            raise error
        _require_tensor_outputs(out)
        self._require_finite_reference(trial, out, copies)
        return out

    def _try_reference(self, pristine: tuple, dtype: torch.dtype | None, trial: TrialReport) -> tuple[Any, Any]:
        """``(outputs, None)``, or ``(None, the exception the reference raised)``."""
        try:
            return self._call_reference(pristine, dtype, trial), None
        except _UserRaised as raised:
            return None, raised.error

    def _require_finite_reference(self, trial: TrialReport, out: Any, copies: str) -> None:
        """A reference that returns NaN or Inf checks nothing there (a candidate returning the same NaN would
        pass): the test's bug, reported as ``reference_nonfinite`` with the first such index, never a pass."""
        for name, ref in named_tensors(out, "out"):
            if not compare.is_inexact(ref):
                continue
            bad = ~torch.isfinite(ref)
            if bool(bad.any()):
                where = tuple(int(i) for i in bad.nonzero()[0].tolist())
                self._fail("reference_nonfinite", f"the REFERENCE `{_callable_name(self.reference)}` returned "
                           f"NaN/Inf in {name} (fix the reference or make_inputs)", trial, [
                               f"{int(bad.sum())} of {ref.numel()} elements of the reference's {name} "
                               f"{dtype_name(ref.dtype)}{list(ref.shape)} are non-finite, computed on {copies}; first "
                               f"at index {where}: {_num(ref[where])}",
                               "a non-finite reference checks nothing there (a candidate returning the same NaN would "
                               "match it): draw inputs inside the reference's domain (e.g. positive for log or sqrt) "
                               "or compute the reference stably"], output=name)

    def _honest_runs(self, pristine: tuple, ref_out: Any) -> "_Estimate":
        """The reference at the candidate's precision and on float64 ``|inputs|`` (for the honest-error
        estimate); the first also gives the expected output dtypes. A run that fails is left out, with why."""
        if self.reference_dtype is None:  # the reference already ran at the inputs' precision
            if self.expected_dtypes is None:
                self.expected_dtypes = [t.dtype for _, t in named_tensors(ref_out, "out")]
            return _Estimate(None, None, ("reference run in the inputs' dtypes: table bounds only",), None)
        declared = dtype_name(self.tolerance["compute_dtype"]) if self.tolerance["compute_dtype"] is not None else None
        notes: list[str] = []
        with honest.candidate_precision(tf32=declared == "tf32",
                                        reduced_precision_reduction=declared in ("float16", "bfloat16")):
            same = self._optional_run(pristine, None, "same-precision", notes, (GateFailure,))
        if self.expected_dtypes is None:
            self.expected_dtypes = self._native_dtypes(pristine, ref_out, same)
        # a reference may reject |inputs| in any way; the estimate then omits it
        magnitude = self._optional_run(map_tensors(pristine, _magnitude), self.upcast_dtype, "|inputs|", notes,
                                       (Exception,))
        floating = sum(t.numel() for _, t in named_call_tensors(*pristine) if t.is_floating_point())
        return _Estimate(same, magnitude, tuple(notes), floating)

    def _optional_run(self, pristine: tuple, dtype: torch.dtype | None, what: str, notes: list[str],
                      catch: tuple[type[BaseException], ...]) -> Any:
        """A reference run the estimate can do without: None (and why, in ``notes``) when the reference raises
        (on these dtypes or magnitudes), or the gate fails it with one of ``catch``; replaced timing functions
        still fail the gate."""
        try:
            return self._call_reference(pristine, dtype, None)
        except _UserRaised as raised:
            notes.append(f"{what} run failed ({type(raised.error).__name__}): not used")
            return None
        except catch as exc:
            if isinstance(exc, GateFailure) and exc.reason == "timer_tampered":
                raise
            notes.append(f"{what} run failed ({type(exc).__name__}): not used")
            return None

    def _call_reference(self, pristine: tuple, dtype: torch.dtype | None, trial: TrialReport) -> Any:
        args, kwargs = (map_tensors(part, lambda t: compare.upcast(t, dtype)) for part in pristine)
        before = [t.clone() for _, t in named_call_tensors(args, kwargs)]
        try:
            out = self.reference(*args, **kwargs)
        except Exception as exc:  # the reference's own error: the caller decides how it is reported
            raise _UserRaised(exc) from None
        outs = self._out_buffers(args, kwargs)
        if out is None and outs:
            out = outs[0] if len(outs) == 1 else tuple(outs)
        for (name, now), then in zip(named_call_tensors(args, kwargs), before):
            if any(now is o for o in outs):
                continue
            if compare.max_difference(now, then) != 0:
                self._fail("input_mutated", f"the REFERENCE modified its input {name} (fix the reference)",
                           trial, [])
        out = map_tensors(out, _snapshot)
        for device in {t.device for _, t in named_tensors(out, "out") if t.is_cuda}:
            torch.cuda.synchronize(device)
        self._check_timers(trial, "after the reference")
        return out

    @staticmethod
    def _native_dtypes(pristine: tuple, upcast_out: Any, native: Any) -> list[torch.dtype]:
        """Output dtypes of the reference on the inputs' own dtypes (what the candidate must return); the
        promoted floating input dtype when that run failed."""
        if native is not None:
            return [t.dtype for _, t in named_tensors(native, "out")]
        floats = [t.dtype for _, t in named_call_tensors(*pristine) if t.is_floating_point()]
        promoted = floats[0] if floats else None
        for dt in floats[1:]:
            promoted = torch.promote_types(promoted, dt)
        return [promoted if (promoted is not None and t.is_floating_point()) else t.dtype
                for _, t in named_tensors(upcast_out, "out")]

    # -- judging one trial ------------------------------------------------------------------------
    def _judge(self, trial: TrialReport, first: Any, second: Any, ref_out: Any, estimate: "_LazyEstimate") -> None:
        if structure_of(first) != structure_of(ref_out):
            loose = [name for name, value in named_leaves(first, "out")
                     if value is not None and not isinstance(value, torch.Tensor)]
            hint = ([f"kernel_check compares torch tensors: {loose[0]} is not one; return a torch.Tensor (several "
                     "outputs as a tuple, list or dict of tensors)"] if loose else [])
            self._fail("shape", "the candidate's outputs are structured differently from the reference's", trial,
                       [f"the candidate returned {describe(first)}",
                        f"the reference returned {describe(ref_out)}", *hint])
        pairs = list(zip(named_tensors(first, "out"), named_tensors(ref_out, "out"), self.expected_dtypes or []))
        for (name, cand), (_, ref), expected in pairs:
            if cand.shape != ref.shape:
                self._fail("shape", f"{name} has shape {list(cand.shape)}, the reference's has {list(ref.shape)}",
                           trial, [f"output {name}: candidate {cand.dtype} {list(cand.shape)}, reference "
                                   f"{ref.dtype} {list(ref.shape)}"])
            if expected is not None and cand.dtype != expected:
                self._fail("dtype", f"{name} is {cand.dtype}, the reference returns {expected} on these inputs",
                           trial, [f"output {name}: shape {list(cand.shape)}"])
        for (name, cand), (_, ref), _ in pairs:
            stale = poison.poisoned_mask(cand)
            if stale is not None:
                ref_poison = poison.poisoned_mask(ref.to(cand.device, cand.dtype))
                stale = stale & ~ref_poison
                if bool(stale.any()):
                    where = tuple(int(i) for i in stale.nonzero()[0].tolist())
                    self._fail("stale_output", f"{name} has elements the candidate never wrote", trial, [
                        f"{int(stale.sum())} of {cand.numel()} elements of {name} still hold the poison pattern "
                        f"(0xFF bytes) put into fresh allocations and freed memory before the call; first at "
                        f"index {where} (reference there: {_num(ref[where])}): outputs left unwritten read "
                        "stale memory (e.g. torch.empty holding an earlier result)"])
            bad = compare.nonfinite_where_reference_finite(cand, ref)
            if bad is not None and bool(bad.any()):
                where = tuple(int(i) for i in bad.nonzero()[0].tolist())
                self._fail("nonfinite", f"{name} has NaN/Inf where the reference is finite", trial, [
                    f"{int(bad.sum())} of {cand.numel()} elements of {name} are non-finite; first at index {where}: "
                    f"candidate {_num(cand[where])} vs reference {_num(ref[where])}"])
        for (name, cand), (_, ref), _ in pairs:
            tol = tolerance_for(cand.dtype, **self.tolerance)
            result = compare.compare_output(name, cand, ref, tol)
            # the derived bound is never below the table's, so the estimate is only needed when the table fails
            if not result.passed and compare.is_inexact(cand) and not tol.exact:
                runs = estimate.get()
                same, magnitude = runs.outputs(ref_out)
                compute = self.tolerance["compute_dtype"]
                bound = honest.estimate(ref, same.get(name), magnitude.get(name), table=tol.rel_norm,
                                        roundoff=accumulation_roundoff(cand.dtype, compute),
                                        ceiling=rel_norm_ceiling(cand.dtype, compute), notes=runs.notes,
                                        inputs_per_output=runs.inputs_per_output(ref))
                result = compare.compare_output(name, cand, ref, tol, bound)
            trial.outputs.append(result)
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
        if second is not None:
            self._judge_determinism(trial, first, second)

    def _equal_earlier_output(self, name: str, cand: torch.Tensor) -> int | None:
        for index, outputs in self.previous_outputs:
            for other_name, other in named_tensors(outputs, "out"):
                if other_name == name and other.shape == cand.shape and compare.max_difference(cand, other) == 0:
                    return index
        return None

    def _judge_determinism(self, trial: TrialReport, first: Any, second: Any) -> None:
        if structure_of(first) != structure_of(second):
            self._fail("nondeterministic", "two calls on the same inputs returned differently structured outputs",
                       trial, [f"first {describe(first)}", f"second {describe(second)}"])
        for (name, a), (_, b) in zip(named_tensors(first, "out"), named_tensors(second, "out")):
            difference = compare.max_difference(a, b)
            trial.nondeterminism = max(trial.nondeterminism, difference)
            if difference > self.nondeterminism_atol and not self.allow_nondeterminism:
                count = int((a != b).sum()) if a.shape == b.shape else a.numel()
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
        message = failure_message(self.report, reason, headline, trial, details)
        raise GateFailure(reason, message, report=self.report) from cause


class _LazyEstimate:
    """The honest-error runs of one trial, made on first use (two reference runs a passing trial skips)."""

    def __init__(self, make: Callable[[], "_Estimate"]) -> None:
        self._make, self._value = make, None

    def get(self) -> "_Estimate":
        if self._value is None:
            self._value = self._make()
        return self._value


class _Estimate:
    """The reference's outputs at the candidate's precision and on ``|inputs|`` (None: not run or failed)."""

    def __init__(self, same: Any, magnitude: Any, notes: tuple[str, ...], input_elements: int | None) -> None:
        self.same, self.magnitude, self.notes = same, magnitude, notes
        self.input_elements = input_elements  # floating input elements (None: no estimate is made)

    def inputs_per_output(self, output: torch.Tensor) -> float | None:
        if not self.input_elements or output.numel() == 0:
            return None
        return self.input_elements / output.numel()

    def outputs(self, ref_out: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """Each run's tensors by output name, only when structured like the reference's outputs."""
        return tuple({name: t for name, t in named_tensors(run, "out")}
                     if run is not None and structure_of(run) == structure_of(ref_out) else {}
                     for run in (self.same, self.magnitude))


def _magnitude(tensor: torch.Tensor) -> torch.Tensor:
    """``|x|`` for real floating inputs (the size of each term the reference adds); others unchanged."""
    return tensor.abs() if tensor.is_floating_point() else tensor


def _require_tensor_outputs(out: Any) -> None:
    """Only tensors are compared: a reference output with no tensor, or with other values beside its tensors
    (a Python number, a bool), would leave those values unchecked, so it is a usage error (None is allowed)."""
    leaves = list(named_leaves(out, "out"))
    loose = [f"{name} ({type(value).__name__})" for name, value in leaves
             if value is not None and not isinstance(value, torch.Tensor)]
    if loose or not any(isinstance(value, torch.Tensor) for _, value in leaves):
        raise DitgateUsageError(
            "kernel_check compares tensor outputs only, but the reference returned "
            + (f"non-tensor values {', '.join(loose)}" if loose else "no tensor")
            + ": nothing would check them; return them as tensors (nested in tuples/lists/dicts)")


def _snapshot(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().clone()


def _num(value: torch.Tensor) -> str:
    item = value.item() if value.dtype.itemsize > 1 or not value.is_floating_point() else value.float().item()
    return f"{item:.6g}" if isinstance(item, float) else str(item)
