"""The pair's guard: fresh inputs for every timed call, and audits of what the timed calls did.

``ditbench.pair`` checks once, before timing, that the candidate computes what the reference computes; a
candidate that is honest while checked and cheats afterwards is caught here, while it is timed:

- every timed call (each call of a latency batch) gets fresh copies of the arguments, one element of each
  floating one changed (:mod:`pytest_ditgate.bench.fresh_inputs`): a result cached by identity, pointer or an
  ``is`` test is stale;
- every timed call's output, on both sides, is copied as soon as the call returns (outside the timed window);
  when a round (one call of each side) has run, it is audited with a probability that gives about
  :data:`AUDITS` audited rounds a pair (drawn from the operating system's entropy only then, so nothing the
  candidate can read beforehand says which): torch is compared with what it was when the pair began
  (:mod:`pytest_ditgate.bench.torch_state`, ``torch_tampered``), the candidate's output with its copy
  (``stale_output``: work still running when the call returned, on a thread or another stream) and its argument
  copies with what they were made with (``input_mutated``). The work between calls is the same for both sides,
  and an audit's comes between rounds, before either side, so it favours neither (an audit after the candidate's
  calls only made the reference's next call slower: the same function against itself read faster 14 times in 80
  at 10 rounds);
- after timing (:meth:`PairGuard.finish`): torch again, the pair's own arguments against their snapshot
  (``input_mutated``), and each audited output against the reference on that call's own inputs
  (``output_audit``, by the ``judge`` that ``ditbench.pair`` passes: its agreement check).

Arguments the pair declares written (:mod:`pytest_ditgate.bench.declared`) are the functions' to write: an out or
in-out argument is part of what the call produced (copied as it returns, checked for ``stale_output``, judged
with the return value), a scratch argument is neither compared nor a mutation; a write into any other argument is
``input_mutated``. Where a latency batch reuses copies, the batch's last call, the one audited, gets its own, so
that its in-out arguments start from the pair's values.

Nothing here runs inside a timed window. A pair with no audited call (rare with few rounds) gets one extra,
untimed call that is audited.

Perturbed copies can leave a function's domain (a positive-definite matrix whose diagonal element shrank is no
longer one). The reference decides, never the candidate: before the warm-up it runs on exact copies and on
:data:`PROBES` perturbed ones (:meth:`PairGuard.prepare`), and where it raises or returns non-finite values the
exact copies do not give, the pair's copies stay exact. When a timed function raises on perturbed copies
(:meth:`PairGuard.retry`), the reference runs on those same copies: if it raises too, the pair is warmed up and
timed again on exact copies; if not, the exception is the function's (the candidate's ``crash``). The record
says which copies were timed, and why.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from pytest_ditgate.arguments import callable_name
from pytest_ditgate.bench.declared import Declared, Result
from pytest_ditgate.bench.fresh_inputs import Change, FreshInputs, same_bits
from pytest_ditgate.bench.timers import Call, CallRaised, Guard, synchronize
from pytest_ditgate.errors import GateFailure
from pytest_ditgate.timer_integrity import watch

#: audited candidate calls a pair aims for (each one judged against the reference after timing)
AUDITS = 12
#: perturbed copies the reference runs on before the warm-up, to keep the copies exact outside its domain
PROBES = 3
#: a latency batch gets distinct copies for its calls up to this many bytes of them; beyond, they are reused in turn
POOL_BYTES = 256 << 20
#: audited outputs waiting for their judgement after timing take at most this many bytes; beyond, judged at once
KEEP_BYTES = 512 << 20

#: judge(result, args, kwargs): raises the GateFailure of a call's result (its return value and the out and in-out
#: arguments it wrote, copied as it returned) that is not the reference's on those inputs
Judge = Callable[[Result, tuple[Any, ...], dict[str, Any]], None]


@dataclass
class Audit:
    """What ``ditbench.pair`` adds to the guard of ``measure_pair``: the judge of a timed call's output (None:
    outputs are not judged), and torch as it was before the agreement check ran."""

    judge: Judge | None = None
    torch_state: Any = None


@dataclass
class FreshCall(Call):
    """A timed call bound to fresh copies of the pair's arguments, made with ``changes`` (an exception it raises
    carries the call, so the guard can tell whose domain the copies left)."""

    changes: tuple[Change, ...] = ()

    def __call__(self) -> Any:
        try:
            return super().__call__()
        except CallRaised as raised:
            raised.call = self
            raise


@dataclass
class _Audited:
    number: int | None  # the candidate's timed call it was (None: the extra untimed call)
    result: Result | None
    snapshot: Result
    call: FreshCall | None
    bytes: int = 0
    #: storages the other side's output of the same round wrote: an output held there may change (a buffer both
    #: sides share, such as one CUDA graph's static output), and is judged by its copy alone
    shared: frozenset[int] = frozenset()

    def where(self) -> str:
        return "an extra, untimed call" if self.number is None else f"timed call {self.number}"


def _nonfinite(result: Result) -> int:
    """Non-finite elements of the floating tensors of a call's result."""
    return sum(int((~t.isfinite()).sum()) for _, t in result.named() if t.is_floating_point() or t.is_complex())


def _storage(tensor: Any) -> int:
    """Where a tensor's storage starts (two tensors of one buffer share it)."""
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # no storage to point at (sparse, a subclass)
        return -1 - id(tensor)


def _nbytes(result: Result) -> int:
    return sum(t.numel() * t.element_size() for _, t in result.named())


class PairGuard(Guard):
    """Hands the samplers fresh calls of a pair and audits the candidate's (call 0); see the module. ``declared``:
    the arguments the functions write."""

    def __init__(self, calls: Sequence[Call], *, perturb: bool = True, declared: Declared | None = None,
                 audit: Audit | None = None) -> None:
        from pytest_ditgate.bench.torch_state import TorchState

        super().__init__(calls)
        audit = audit or Audit()
        self.judge = audit.judge
        self.torch = audit.torch_state if audit.torch_state is not None else TorchState()
        self.declared = declared if declared is not None else Declared()
        self.inputs = FreshInputs(calls[0].args, calls[0].kwargs, perturb=perturb, writable=self.declared.writable,
                                  poisoned=self.declared.poisoned)
        self.name = callable_name(calls[0].fn)
        self.rng = random.Random(random.SystemRandom().getrandbits(64))  # which elements change: not secret
        self.secret = random.SystemRandom()  # which calls are audited: drawn after each call returns
        self.rate = 1.0
        self.timed = 0
        self.audited = 0
        self.returns = 0
        self.last: list[tuple[Call, Result, Result] | None] = [None] * len(calls)
        self.kept: list[_Audited] = []
        self.exact_because = ""

    def prepare(self) -> None:
        """Watch torch's thread-count setters; keep the copies exact where the reference cannot take perturbed
        ones (the module says how)."""
        self.torch.watch_setters()
        if not self.inputs.varied:
            return
        reference = self.calls[1]
        args, kwargs = self.inputs.make(())
        exact = _nonfinite(self.declared.result(Call(reference.fn, args, kwargs)(), args, kwargs))
        for _ in range(PROBES):
            args, kwargs = self.inputs.make(self.inputs.draw(self.rng))
            try:
                probed = self.declared.result(reference.fn(*args, **kwargs), args, kwargs)
            except Exception as exc:  # noqa: BLE001 - the reference's domain, not an error of the pair
                self._exact(f"the reference raised {type(exc).__name__} on perturbed copies")
                return
            if _nonfinite(probed) > exact:
                self._exact("the reference returned non-finite values on perturbed copies")
                return

    def close(self) -> None:
        self.torch.unwatch_setters()

    def _exact(self, because: str) -> None:
        self.exact_because = because
        self.inputs.perturb = False

    def retry(self, raised: CallRaised) -> bool:
        """A timed function raised on perturbed copies that the reference cannot take either: time again on
        exact copies (True). Anything else is the function's own exception (False)."""
        call = raised.call
        if not isinstance(call, FreshCall) or not call.changes or not self.inputs.varied:
            return False
        args, kwargs = self.inputs.make(call.changes)
        try:
            self.calls[1].fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the reference's domain, not an error of the pair
            self._exact(f"the reference raised {type(exc).__name__} on perturbed copies a timed call had")
            self.kept, self.timed, self.audited, self.returns = [], 0, 0, 0
            self.last = [None] * len(self.calls)
            return True
        return False

    def plan(self, rounds: int) -> None:
        """``rounds`` calls of each side will be timed: audit about :data:`AUDITS` of the candidate's."""
        self.rate = min(1.0, AUDITS / max(1, rounds))

    def call(self, index: int) -> FreshCall:
        changes = self.inputs.draw(self.rng)
        args, kwargs = self.inputs.make(changes)
        return FreshCall(self.calls[index].fn, args, kwargs, changes)

    def batch(self, index: int, count: int) -> list[Call]:
        """``count`` calls on distinct copies up to :data:`POOL_BYTES` of them, then reused in turn; where the
        functions write out or in-out arguments, the last call (the one :meth:`returned` hears of) always gets
        its own, so that what it produced came from the pair's values."""
        distinct = max(1, min(count, POOL_BYTES // max(1, self.inputs.nbytes)))
        pool = [self.call(index) for _ in range(distinct)]
        calls = [pool[i % distinct] for i in range(count)]
        if self.declared.compared and count > distinct:
            calls[-1] = self.call(index)
        return calls

    def returned(self, index: int, call: Call, output: Any) -> None:
        result = self.declared.result(output, call.args, call.kwargs)
        self.last[index] = (call, result, result.copy())
        self.returns += 1
        if self.returns % len(self.calls):
            return
        (call, result, snapshot), others = self.last[0], self.last[1:]  # a round has run
        self.last = [None] * len(self.calls)
        self.timed += 1
        if self.secret.random() < self.rate:
            shared = frozenset(_storage(t) for other in others if other is not None for _, t in other[1].named())
            self._audit(call, result, snapshot, self.timed, shared)

    def _audit(self, call: Call, result: Result, snapshot: Result, number: int | None,
               shared: frozenset[int] = frozenset()) -> None:
        where = f"the round of the candidate's timed call {number}" if number else "the candidate's extra call"
        self.check_torch(f"after {where}")
        self.audited += 1
        self._settle(_Audited(number, result, snapshot, call if isinstance(call, FreshCall) else None,
                              _nbytes(snapshot), shared))

    def _settle(self, audit: _Audited) -> None:
        """An audited call's output unchanged since it was copied, its arguments as they were made; its copy kept
        for the judge."""
        synchronize()
        now = audit.result.named() if audit.result is not None else []
        then = dict(audit.snapshot.named())
        stale = [name for name, tensor in now
                 if _storage(tensor) not in audit.shared and not same_bits(tensor, then[name])]
        if stale:
            raise GateFailure("stale_output", f"ditbench.pair: the candidate `{self.name}`'s {', '.join(stale)} of "
                              f"{audit.where()} changed after the call returned (copied as it returned, compared "
                              "when its round ended): work was still running when it returned (a thread or another "
                              "stream writing the output), which the timing does not count. Finish the work before "
                              "returning. Nothing was recorded.")
        if audit.call is not None:
            written = self.inputs.written(audit.call.args, audit.call.kwargs, audit.call.changes)
            if written:
                raise GateFailure("input_mutated", f"ditbench.pair: the candidate `{self.name}` wrote into its "
                                  f"argument(s) {', '.join(written)} in {audit.where()}; a timed function must leave "
                                  "its inputs as they are (the agreement check fails the same write), unless the "
                                  "pair declares the argument written: out_args=(...) for an output buffer, "
                                  "inout_args=(...) for an argument read and updated in place, scratch_args=(...) "
                                  "for a workspace"
                                  + (f" (declared: {self.declared.describe()})" if self.declared else "")
                                  + ". Nothing was recorded.")
        audit.result = None
        if self.judge is None:
            return
        self.kept.append(audit)
        while len(self.kept) > 1 and sum(a.bytes for a in self.kept) > KEEP_BYTES:
            self._judge(self.kept.pop(0))

    def check_torch(self, when: str) -> None:
        """``torch_tampered`` (after putting torch back) when torch's functions or settings changed."""
        changes = self.torch.changes()
        if changes:
            self.torch.restore()
            raise GateFailure("torch_tampered", f"ditbench.pair: torch changed while the pair ran (seen {when}): "
                              f"{'; '.join(changes)}. Both sides run in one process, so what one side's code changes "
                              "in torch changes the other's work or conditions; a timed function must leave torch's "
                              "functions and settings as they are. Put back; nothing was recorded.")

    def _judge(self, audit: _Audited) -> None:
        args, kwargs = self.inputs.make(audit.call.changes if audit.call is not None else ())
        try:
            self.judge(audit.snapshot, args, kwargs)
        except GateFailure as failure:
            raise GateFailure("output_audit", f"ditbench.pair: the candidate `{self.name}` computed the reference's "
                              f"output when checked before timing, but not in {audit.where()} (one of {self.audited} "
                              f"calls audited at random out of {self.timed}, on that call's own inputs): "
                              f"[{failure.reason}] {failure.message}", report=failure.report) from None

    def finish(self) -> dict[str, Any]:
        """After timing: settle and judge every audit (one extra untimed call is audited when the sample drew
        none), and compare torch and the pair's arguments with what they were; returns the candidate's calls
        audited and how the inputs were made (for its ``extra``)."""
        if self.audited == 0:
            call = self.call(0)
            result = self.declared.result(call(), call.args, call.kwargs)
            synchronize()
            self._audit(call, result, result.copy(), None)
        self.check_torch("after timing")
        self.torch.unwatch_setters()
        mutated = self.inputs.mutated()
        if mutated:
            raise GateFailure("input_mutated", f"ditbench.pair: the pair's argument(s) {', '.join(mutated)} changed "
                              "while it ran (the timed functions are handed copies, so a function reached the "
                              "arguments themselves: a global or a closure); the timing then measured other inputs "
                              "than the ones checked. Nothing was recorded.")
        for audit in self.kept:
            self._judge(audit)
        self.kept = []
        if self.inputs.varied:
            inputs = "fresh copies, one element of each floating argument changed"
        else:
            inputs = "fresh copies" + (f" (exact: {self.exact_because})" if self.exact_because else "")
        if self.declared.poisoned:
            inputs += "; out and scratch arguments poisoned"
        return {"audited_calls": self.audited, "inputs": inputs}


watch(__name__)
