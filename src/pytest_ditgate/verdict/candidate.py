"""``ditgate_candidate``: the gate suite declares the candidate it built, and its class is checked.

``ditgate_candidate.declare(model, sampling={...}, frozen_sampling={...})`` inspects the modules and
weights for low-bit dtypes and quantization classes and compares the sampling settings with the frozen
corpus. The resulting class (never weaker than the declared ``--ditgate-class``) is what the quality
gate applies in this process (this module hands it over under the quality gate's own
``forced_class_key``), and the evidence travels to the verdict with the next test report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import pytest

from pytest_ditgate.quality.quality_plugin import forced_class_key
from pytest_ditgate.quality.specs import DEFAULT_CLASS

if TYPE_CHECKING:
    from pytest_ditgate.verdict.classify import Classification

#: the experiment class this process judges the candidate as, once a gate suite declared its candidate
#: (``ditgate_candidate.declare``): the declared class, or a stricter one the evidence forces
effective_class_key = pytest.StashKey["Classification"]()


def declared_class(config: pytest.Config) -> str:
    """``--ditgate-class`` / ini ``ditgate_class`` (default ``numerical``)."""
    value = config.getoption("ditgate_class", default=None)
    if value is None:
        try:
            value = config.getini("ditgate_class") or None
        except ValueError:
            value = None
    return str(value or DEFAULT_CLASS)


def effective_class(config: pytest.Config) -> str:
    """The class to judge quality with in this process: the declared one unless evidence overrides it."""
    found = config.stash.get(effective_class_key, None)
    return found.effective if found is not None else declared_class(config)


@dataclass(repr=False)
class CandidateDeclaration:
    config: pytest.Config
    unsent: list[str] = field(default_factory=list)

    def __repr__(self) -> str:  # pytest prints the fixture beside a failing test: keep it one short line
        return f"<ditgate_candidate fixture: class {declared_class(self.config)}>"

    def declare(self, *modules: Any, state_dicts: Iterable[Mapping[str, Any]] = (),
                sampling: Mapping[str, Any] | None = None, frozen_sampling: Mapping[str, Any] | None = None) -> "Classification":
        from pytest_ditgate.verdict.classify import approximation_evidence, classify_tagged, quantization_evidence

        state_dicts = _check_declaration(modules, state_dicts, sampling, frozen_sampling)

        quant = [f"quant: {e}" for e in quantization_evidence(modules, state_dicts)]
        approx = [f"approx: {e}" for e in approximation_evidence(sampling or {}, frozen_sampling or {})]
        previous = self.config.stash.get(effective_class_key, None)
        evidence = list(previous.evidence) if previous else []
        evidence += [e for e in quant + approx if e not in evidence]
        result = classify_tagged(declared_class(self.config), evidence)
        self.config.stash[effective_class_key] = result
        self.config.stash[forced_class_key] = result.effective
        self.unsent.extend(e for e in quant + approx if e not in self.unsent)
        return result


def _check_declaration(modules: tuple[Any, ...], state_dicts: Any, sampling: Any,
                       frozen_sampling: Any) -> list[Mapping[str, Any]]:
    """``declare``'s arguments, before any evidence is gathered: a usage error names the argument."""
    from pytest_ditgate.arguments import describe
    from pytest_ditgate.errors import DitgateUsageError

    call = "ditgate_candidate.declare(*modules, state_dicts=..., sampling=..., frozen_sampling=...)"
    for index, module in enumerate(modules):
        if not (callable(getattr(module, "named_modules", None)) and callable(getattr(module, "named_parameters", None))):
            raise DitgateUsageError(f"{call}: module {index} must be a torch.nn.Module, got {describe(module)}")
    states = None if isinstance(state_dicts, (Mapping, str)) or not hasattr(state_dicts, "__iter__") else list(state_dicts)
    if states is None or not all(isinstance(state, Mapping) for state in states):
        raise DitgateUsageError(f"{call}: state_dicts must be a list of state dicts, got {describe(state_dicts)}")
    for name, value in (("sampling", sampling), ("frozen_sampling", frozen_sampling)):
        if value is not None and not isinstance(value, Mapping):
            raise DitgateUsageError(f"{call}: {name} must be a mapping of sampling settings, got {describe(value)}")
    return states


_declaration_key = pytest.StashKey[CandidateDeclaration]()


@pytest.fixture(scope="session")
def ditgate_candidate(pytestconfig: pytest.Config) -> CandidateDeclaration:
    """Declare the candidate a gate suite built, so that its experiment class is checked, not trusted."""
    return pytestconfig.stash.setdefault(_declaration_key, CandidateDeclaration(pytestconfig))


def take_unsent_evidence(config: pytest.Config) -> list[str]:
    """Evidence not yet attached to a report (each piece travels to the controller once)."""
    declaration = config.stash.get(_declaration_key, None)
    if declaration is None or not declaration.unsent:
        return []
    sent, declaration.unsent = declaration.unsent, []
    return sent
