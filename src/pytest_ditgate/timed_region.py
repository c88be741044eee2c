"""``TimedRegion``: what a lane's timing module declares, so that the judge times the lane itself.

A lane that names ``timing = "<module>.py"`` in ``[tool.ditgate.lanes.<name>]`` gives the judge a module whose
``REGIONS`` list these. The judge (``ditgate experiment``, ``ditgate baseline``) builds each region's
``candidate`` in a process of the candidate's commit, and the lane best's candidate and the ``baseline`` in a
process of a read-only checkout of the best's commit; it draws every call's inputs from its own seed inside
each round, times each round on its own clock, and audits outputs against the baseline's for the same inputs
(docs/agent_loop.md, "How the judge times"). The module is a fixed path: a candidate cannot change what is
timed, or how.

```python
from pytest_ditgate.timed_region import TimedRegion

def build(impl):             # "candidate" or "baseline": the function to time (built once)
    ...
def make_inputs(generator):  # a torch.Generator seeded by the judge: fresh arguments for one call
    ...
REGIONS = [TimedRegion("forward", build, make_inputs, device="auto")]
```

Torch-free: the judge reads the declarations; the server processes call them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

#: what ``build`` is asked for
IMPLS = ("candidate", "baseline")


@dataclass(frozen=True)
class TimedRegion:
    """One timed region of a lane.

    - ``build(impl)``: the function to time for ``impl`` ("candidate" or "baseline"), built once per process;
    - ``make_inputs(generator)``: fresh positional arguments of one call, drawn from ``generator`` (a
      ``torch.Generator`` on the region's device, seeded by the judge inside the round);
    - ``device``: "cuda", "cpu" or "auto" (CUDA when available);
    - ``calls``: calls per round (None: about ``round_ms`` of them);
    - ``rounds``: timed rounds per implementation (extended up to ``max_rounds`` while the ratio's interval
      stays wider than the lane's noise floor allows);
    - ``audits``: rounds whose every output the judge checks against the baseline's, chosen at random after
      the round ran;
    - ``audit_rel_l2``: the largest relative L2 error of a candidate's output against the baseline's for the
      same inputs;
    - ``skip``: a callable returning why the region cannot run here (None: it can), e.g. "needs a GPU";
    - ``audit_by_class``: another bound per experiment class (``approximate``, ``quantization``, ...), where the
      class changes the outputs by design; ``None`` there: the baseline's outputs cannot vouch for the class's
      (fewer sampling steps of a random-weight model land anywhere), so each implementation's audited rounds
      are recomputed by a fresh process of its own tree, untimed, and must match within ``self_audit_rel_l2``
      (a replayed, skipped or stateful call does not reproduce there).
    """

    name: str
    build: Callable[[str], Callable[..., Any]]
    make_inputs: Callable[[Any], tuple]
    device: str = "auto"
    calls: int | None = None
    rounds: int = 16
    max_rounds: int = 48
    audits: int = 3
    audit_rel_l2: float = 0.05
    round_ms: float = 50.0
    skip: Callable[[], str | None] | None = None
    audit_by_class: Mapping[str, float | None] = field(default_factory=dict)
    self_audit_rel_l2: float = 1e-3

    def audit_bound(self, experiment_class: str) -> float | None:
        """The rel-L2 bound against the baseline's outputs for a candidate judged as ``experiment_class``
        (None: audited against a fresh process of its own tree instead)."""
        return self.audit_by_class.get(experiment_class, self.audit_rel_l2)

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"TimedRegion name must be a non-empty string, got {self.name!r}")
        for field_name in ("build", "make_inputs"):
            if not callable(getattr(self, field_name)):
                raise ValueError(f"TimedRegion {self.name!r}: {field_name} must be callable")
        if self.device not in ("auto", "cuda", "cpu"):
            raise ValueError(f"TimedRegion {self.name!r}: device must be 'auto', 'cuda' or 'cpu', got {self.device!r}")
        if self.calls is not None and (not isinstance(self.calls, int) or self.calls < 1):
            raise ValueError(f"TimedRegion {self.name!r}: calls must be a positive integer or None")
        if not (isinstance(self.rounds, int) and 4 <= self.rounds <= self.max_rounds):
            raise ValueError(f"TimedRegion {self.name!r}: rounds must be an integer from 4 to max_rounds")
        if not (isinstance(self.audits, int) and 1 <= self.audits <= self.rounds):
            raise ValueError(f"TimedRegion {self.name!r}: audits must be from 1 to rounds")
        if not 0 < float(self.audit_rel_l2) < 1:
            raise ValueError(f"TimedRegion {self.name!r}: audit_rel_l2 must be a fraction in (0, 1)")
        if not 0 < float(self.self_audit_rel_l2) < 1:
            raise ValueError(f"TimedRegion {self.name!r}: self_audit_rel_l2 must be a fraction in (0, 1)")
        for klass, bound in dict(self.audit_by_class).items():
            if bound is not None and not 0 < float(bound) < 1:
                raise ValueError(f"TimedRegion {self.name!r}: audit_by_class[{klass!r}] must be a fraction in "
                                 "(0, 1) or None")
