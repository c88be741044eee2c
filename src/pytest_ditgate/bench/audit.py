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
from pytest_ditgate.bench.fresh_inputs import Change, FreshInputs, same_bits
from pytest_ditgate.bench.timers import Call, CallRaised, Guard, synchronize
from pytest_ditgate.correctness.structure import map_tensors, named_tensors
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

#: judge(output, args, kwargs): raises the GateFailure of an output that is not the reference's on those inputs
Judge = Callable[[Any, tuple[Any, ...], dict[str, Any]], None]


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
    output: Any
    snapshot: Any
    call: FreshCall | None
    bytes: int = 0
    #: storages the other side's output of the same round wrote: an output held there may change (a buffer both
    #: sides share, such as one CUDA graph's static output), and is judged by its copy alone
    shared: frozenset[int] = frozenset()

    def where(self) -> str:
        return "an extra, untimed call" if self.number is None else f"timed call {self.number}"


def _nonfinite(value: Any) -> int:
    """Non-finite elements of the floating tensors in ``value``."""
    return sum(int((~t.isfinite()).sum()) for _, t in named_tensors(value, "out")
               if t.is_floating_point() or t.is_complex())


def _storage(tensor: Any) -> int:
    """Where a tensor's storage starts (two tensors of one buffer share it)."""
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # no storage to point at (sparse, a subclass)
        return -1 - id(tensor)


def _nbytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for _, t in named_tensors(value, "out"))


class PairGuard(Guard):
    """Hands the samplers fresh calls of a pair and audits the candidate's (call 0); see the module."""

    def __init__(self, calls: Sequence[Call], *, perturb: bool = True, audit: Audit | None = None) -> None:
        from pytest_ditgate.bench.torch_state import TorchState

        super().__init__(calls)
        audit = audit or Audit()
        self.judge = audit.judge
        self.torch = audit.torch_state if audit.torch_state is not None else TorchState()
        self.inputs = FreshInputs(calls[0].args, calls[0].kwargs, perturb=perturb)
        self.name = callable_name(calls[0].fn)
        self.rng = random.Random(random.SystemRandom().getrandbits(64))  # which elements change: not secret
        self.secret = random.SystemRandom()  # which calls are audited: drawn after each call returns
        self.rate = 1.0
        self.timed = 0
        self.audited = 0
        self.returns = 0
        self.last: list[tuple[Call, Any, Any] | None] = [None] * len(calls)
        self.kept: list[_Audited] = []
        self.exact_because = ""

    def prepare(self) -> None:
        """Watch torch's thread-count setters; keep the copies exact where the reference cannot take perturbed
        ones (the module says how)."""
        self.torch.watch_setters()
        if not self.inputs.varied:
            return
        reference = self.calls[1]
        exact = _nonfinite(Call(reference.fn, *self.inputs.make(()))())
        for _ in range(PROBES):
            args, kwargs = self.inputs.make(self.inputs.draw(self.rng))
            try:
                probed = reference.fn(*args, **kwargs)
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
        distinct = max(1, min(count, POOL_BYTES // max(1, self.inputs.nbytes)))
        pool = [self.call(index) for _ in range(distinct)]
        return [pool[i % distinct] for i in range(count)]

    def returned(self, index: int, call: Call, output: Any) -> None:
        self.last[index] = (call, output, map_tensors(output, lambda t: t.detach().clone()))
        self.returns += 1
        if self.returns % len(self.calls):
            return
        (call, output, snapshot), others = self.last[0], self.last[1:]  # a round has run
        self.last = [None] * len(self.calls)
        self.timed += 1
        if self.secret.random() < self.rate:
            shared = frozenset(_storage(t) for other in others if other is not None
                               for _, t in named_tensors(other[1], "out"))
            self._audit(call, output, snapshot, self.timed, shared)

    def _audit(self, call: Call, output: Any, snapshot: Any, number: int | None,
               shared: frozenset[int] = frozenset()) -> None:
        where = f"the round of the candidate's timed call {number}" if number else "the candidate's extra call"
        self.check_torch(f"after {where}")
        self.audited += 1
        self._settle(_Audited(number, output, snapshot, call if isinstance(call, FreshCall) else None,
                              _nbytes(snapshot), shared))

    def _settle(self, audit: _Audited) -> None:
        """An audited call's output unchanged since it was copied, its arguments as they were made; its copy kept
        for the judge."""
        synchronize()
        now = list(named_tensors(audit.output, "output"))
        then = dict(named_tensors(audit.snapshot, "output"))
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
                                  "its inputs as they are (the agreement check fails the same write). Nothing was "
                                  "recorded.")
        audit.output = None
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
            output = call()
            synchronize()
            self._audit(call, output, map_tensors(output, lambda t: t.detach().clone()), None)
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
        return {"audited_calls": self.audited, "inputs": inputs}


watch(__name__)
