"""The ``quality_gate`` fixture, the quality options, and the pass/fail transition table of a run.

Each ``quality_gate.check`` result rides on its test's call report (``report.ditgate_quality``), so
the controller of an xdist run sees every case; the table of baseline -> candidate transitions is
printed in the terminal summary and written to ``<artefact dir>/quality/transitions.json``.
Only stdlib and pytest at import: torch comes with the first check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import pytest

from pytest_ditgate import options
from pytest_ditgate.context import get_context
from pytest_ditgate.errors import DitgateUsageError, GateFailure
from pytest_ditgate.quality.options import (CLASSIFIER, CLIP_MODEL, CLIP_WEIGHTS, CONTRACT, EXPERIMENT_CLASS,
                                            LPIPS_WEIGHTS, OPTIONS)
from pytest_ditgate.quality.specs import DEFAULT_CLASS
from pytest_ditgate.report_properties import QUALITY_ATTRIBUTE

if TYPE_CHECKING:
    from pytest_ditgate.quality.contract import QualityContract
    from pytest_ditgate.quality.evaluate import QualityResult
    from pytest_ditgate.quality.perceptual import PerceptualModels

#: [tool.ditgate] keys that stand in for the options above
TOOL_KEYS = {CONTRACT: "quality_contract", LPIPS_WEIGHTS: "lpips_weights", CLIP_WEIGHTS: "clip_weights",
             CLIP_MODEL: "clip_model", CLASSIFIER: "classifier"}
TRANSITIONS_FILE = "transitions.json"
REPORTER_NAME = "ditgate-quality-reporter"


@dataclass
class QualitySession:
    """Per-run quality state: settings read once, the contract and models loaded on first use, records."""

    rootdir: Path
    contract_path: Path
    contract_explicit: bool
    experiment_class: str
    weights: Any  # WeightsConfig
    _contract: "QualityContract | None" = None
    _models: "PerceptualModels | None" = None
    records: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_config(cls, config: pytest.Config) -> "QualitySession":
        from pytest_ditgate.project_config import load_project_config
        from pytest_ditgate.quality.contract import contract_path_for
        from pytest_ditgate.quality.perceptual import WeightsConfig

        root = Path(config.rootpath)
        try:
            tool = load_project_config(root)
        except DitgateUsageError as exc:
            raise pytest.UsageError(str(exc)) from None
        values = {}
        for spec in OPTIONS:
            value = options.get_option(config, spec)
            if value in (None, spec.default) and TOOL_KEYS.get(spec) in tool:
                value = tool[TOOL_KEYS[spec]]
                if not isinstance(value, str):
                    raise pytest.UsageError(f"[tool.ditgate] {TOOL_KEYS[spec]} must be a string, got {value!r}")
            values[spec] = value
        explicit = values[CONTRACT] is not None
        contract = contract_path_for(root, values[CONTRACT])
        weights = WeightsConfig.from_settings(root, {TOOL_KEYS[spec]: values[spec]
                                                     for spec in (LPIPS_WEIGHTS, CLIP_WEIGHTS, CLIP_MODEL, CLASSIFIER)})
        return cls(root, contract, explicit, values[EXPERIMENT_CLASS] or DEFAULT_CLASS, weights)

    def contract(self) -> "QualityContract":
        if self._contract is None:
            from pytest_ditgate.quality.contract import load_contract

            try:
                label = str(self.contract_path.relative_to(self.rootdir))
            except ValueError:
                label = str(self.contract_path)
            self._contract = load_contract(self.contract_path, label=label)
        return self._contract

    def models(self) -> "PerceptualModels":
        if self._models is None:
            from pytest_ditgate.quality.perceptual import PerceptualModels

            self._models = PerceptualModels(self.weights)
        return self._models


quality_session_key = pytest.StashKey[QualitySession]()
#: the class the declared candidate's evidence forces on this process's quality checks (set by the verdict's
#: ``ditgate_candidate.declare``); a check claiming a weaker class is judged under this one
forced_class_key = pytest.StashKey[str]()
#: per test item: the records of its quality checks (moved onto the call report)
item_records_key = pytest.StashKey["list[dict[str, Any]]"]()


def get_quality_session(config: pytest.Config) -> QualitySession:
    if quality_session_key not in config.stash:
        config.stash[quality_session_key] = QualitySession.from_config(config)
    return config.stash[quality_session_key]


def pytest_configure(config: pytest.Config) -> None:
    """Read the settings, validate a contract the user named, start the reporter (registered under --ditgate)."""
    context = get_context(config)
    session = get_quality_session(config)
    if session.contract_explicit or session.contract_path.exists():
        try:  # a broken contract, or one that does not cover --ditgate-class, stops the run before any test
            session.contract().rules(session.experiment_class)
        except DitgateUsageError as exc:
            raise pytest.UsageError(str(exc)) from None
    _check_weights_paths(session.weights)
    if not context.is_xdist_worker:
        config.pluginmanager.register(QualityReporter(session, context.artefact_dir), REPORTER_NAME)


def _check_weights_paths(weights: Any) -> None:
    """A weights location the user named must exist (an absent one would quietly skip LPIPS / CLIP)."""
    if weights.lpips and not Path(weights.lpips).is_dir():
        raise pytest.UsageError(f"{LPIPS_WEIGHTS.flag} (or ini {LPIPS_WEIGHTS.ini}, [tool.ditgate] lpips_weights) = "
                                f"{weights.lpips}: no such folder; name the folder holding alexnet-owt-7be5be79.pth")
    if weights.clip and not Path(weights.clip).exists():
        raise pytest.UsageError(f"{CLIP_WEIGHTS.flag} (or ini {CLIP_WEIGHTS.ini}, [tool.ditgate] clip_weights) = "
                                f"{weights.clip}: no such file or folder; name an open_clip checkpoint file or a "
                                "folder with open_clip_config.json + open_clip_model.safetensors")


def pytest_unconfigure(config: pytest.Config) -> None:
    reporter = config.pluginmanager.get_plugin(REPORTER_NAME)
    if reporter is not None:
        config.pluginmanager.unregister(reporter)


class QualityGate:
    """What the ``quality_gate`` fixture gives a test: :meth:`check` one case against its baseline."""

    def __init__(self, session: QualitySession, item: pytest.Item, image_root: Path) -> None:
        self._session = session
        self._item = item
        self._image_root = image_root

    def __repr__(self) -> str:  # pytest prints the fixture beside a failing test: keep it one short line
        return f"<quality_gate fixture: class {self._session.experiment_class}, contract {self._session.contract_path}>"

    @property
    def experiment_class(self) -> str:
        """``--ditgate-class``, unless the declared candidate's evidence forces a stricter class."""
        return self._checked_class(self._session.experiment_class)

    def _checked_class(self, claimed: str) -> str:
        from pytest_ditgate.quality.specs import EXPERIMENT_CLASSES

        forced = self._item.config.stash.get(forced_class_key, None)
        if forced is not None and EXPERIMENT_CLASSES.index(forced) > EXPERIMENT_CLASSES.index(claimed):
            return forced
        return claimed

    @property
    def contract(self) -> "QualityContract":
        return self._session.contract()

    @property
    def models(self) -> "PerceptualModels":
        """The session's learned-metric models (LPIPS, CLIP, the project's classifier), loaded on first use."""
        return self._session.models()

    def check(self, case: str, candidate: Mapping[str, Any], baseline: Mapping[str, Any], *,
              experiment_class: str | None = None, kinds: Mapping[str, str] | None = None,
              tolerance_scale: float = 1.0, prompts: Sequence[str] | str | None = None,
              labels: Sequence[int] | None = None, compute_dtype: Any = None,
              image_range: tuple[float, float] | None = None) -> "QualityResult":
        """Evaluate ``case``; raise ``GateFailure(reason="quality")`` listing every failure and image path.

        ``candidate`` and ``baseline`` are both mappings of named tensors, or both single tensors (judged
        under the name ``case``). A misuse (bad contract, uncovered class, wrong arguments) raises
        :class:`~pytest_ditgate.errors.DitgateUsageError`, reported without the plugin's frames.
        """
        __tracebackhide__ = True
        from pytest_ditgate.quality.evaluate import evaluate_quality

        _check_arguments(case, experiment_class=experiment_class, kinds=kinds, tolerance_scale=tolerance_scale,
                         prompts=prompts, labels=labels, image_range=image_range)
        candidate, baseline = _as_named(case, candidate, baseline)
        result = evaluate_quality(candidate, baseline, contract=self._session.contract(),
                                  experiment_class=self._checked_class(experiment_class or self._session.experiment_class),
                                  case=case,
                                  kinds=kinds, tolerance_scale=tolerance_scale, prompts=prompts, labels=labels,
                                  compute_dtype=compute_dtype, image_range=image_range,
                                  models=self._session.models(), image_dir=self._image_root)
        record = {key: value for key, value in result.to_dict().items() if key != "checks"}
        record["nodeid"] = self._item.nodeid
        self._item.stash.setdefault(item_records_key, []).append(record)
        if not result.passed:
            raise GateFailure("quality", result.summary(), report=result)
        return result


CALL = "quality_gate.check(case, candidate, baseline)"


def _check_arguments(case: Any, *, experiment_class: Any, kinds: Any, tolerance_scale: Any, prompts: Any,
                     labels: Any, image_range: Any) -> None:
    """Every argument but the tensors, before any metric runs: a usage error names the argument."""
    from pytest_ditgate.arguments import describe, require_number
    from pytest_ditgate.quality.specs import EXPERIMENT_CLASSES

    if not isinstance(case, str) or not case.strip():
        raise DitgateUsageError(f"{CALL}: case must be the case's name (a non-empty string) and comes first; got "
                                f"{describe(case)}")
    if experiment_class is not None and experiment_class not in EXPERIMENT_CLASSES:
        raise DitgateUsageError(f"{CALL}: experiment_class={experiment_class!r}: choose from "
                                f"{', '.join(EXPERIMENT_CLASSES)} (or None: --ditgate-class)")
    if kinds is not None and not (isinstance(kinds, Mapping) and all(isinstance(k, str) for k in kinds)):
        raise DitgateUsageError(f"{CALL}: kinds must map tensor names to image, latent or activation, got "
                                f"{describe(kinds)}")
    require_number(tolerance_scale, "tolerance_scale", CALL, minimum=0, exclusive=True)
    if prompts is not None and not isinstance(prompts, str) and not (
            isinstance(prompts, (list, tuple)) and all(isinstance(p, str) for p in prompts)):
        raise DitgateUsageError(f"{CALL}: prompts must be a string or a list of strings, got {describe(prompts)}")
    if labels is not None and not (isinstance(labels, (list, tuple)) and all(
            isinstance(label, int) and not isinstance(label, bool) for label in labels)):
        raise DitgateUsageError(f"{CALL}: labels must be a list of class ids (ints), one per image, got "
                                f"{describe(labels)}")
    if image_range is not None:
        ok = isinstance(image_range, (list, tuple)) and len(image_range) == 2 and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in image_range)
        if not ok or image_range[0] >= image_range[1]:
            raise DitgateUsageError(f"{CALL}: image_range must be (low, high), two finite numbers with low < high, "
                                    f"got {describe(image_range)}")


def _as_named(case: str, candidate: Any, baseline: Any) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """Both sides as mappings of named tensors: two tensors become ``{case: tensor}`` each."""
    __tracebackhide__ = True
    from pytest_ditgate.arguments import describe, is_torch_tensor, type_name

    kinds = [isinstance(side, Mapping) for side in (candidate, baseline)]
    tensors = [hasattr(side, "shape") and hasattr(side, "dtype") for side in (candidate, baseline)]
    if not (all(kinds) or (not any(kinds) and all(tensors))):
        names = [type(side).__name__ for side in (candidate, baseline)]
        raise DitgateUsageError(f"quality_gate.check({case!r}, candidate, baseline): give two tensors or two mappings "
                                f"of named tensors, got {names[0]} and {names[1]}")
    named = (candidate, baseline) if all(kinds) else ({case: candidate}, {case: baseline})
    for side, values in zip(("candidate", "baseline"), named):
        for key, value in values.items():
            if not isinstance(key, str) or not is_torch_tensor(value):
                what = f"{side}[{key!r}]" if all(kinds) else side
                hint = " (convert it with torch.from_numpy)" if type_name(value) == "numpy.ndarray" else ""
                raise DitgateUsageError(f"quality_gate.check({case!r}, candidate, baseline): {what} must be a torch "
                                        f"tensor named by a string, got {describe(value)}{hint}")
    return named


@pytest.fixture
def quality_gate(request: pytest.FixtureRequest) -> QualityGate:
    """Judge a candidate's outputs against the frozen baseline under the quality contract."""
    context = get_context(request.config)
    return QualityGate(get_quality_session(request.config), request.node, context.artefact_dir / "quality")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    report = yield
    if call.when == "call" and item_records_key in item.stash:
        setattr(report, QUALITY_ATTRIBUTE, list(item.stash[item_records_key]))  # plain data: survives xdist
    return report


class QualityReporter:
    """Collects every case's record (from the call reports, so xdist workers' too) and reports the
    baseline -> candidate transition table; registered on the controller or a plain run only."""

    def __init__(self, session: QualitySession, artefact_dir: Path) -> None:
        self.session = session
        self.artefact_dir = artefact_dir

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        records = getattr(report, QUALITY_ATTRIBUTE, None)
        if records and report.when == "call":
            self.session.records.extend(records)

    @pytest.hookimpl(trylast=True)  # after other plugins' sections: ditgate's summary is read last
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        from pytest_ditgate.quality.report import table_lines

        if self.session.records:
            terminalreporter.write_sep("-", "ditgate quality: baseline -> candidate")
            for line in table_lines(self.session.records):
                terminalreporter.write_line(line)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        from pytest_ditgate.fsutil import atomic_write_json
        from pytest_ditgate.quality.report import summary_json

        if not self.session.records:
            return
        path = self.artefact_dir / "quality" / TRANSITIONS_FILE
        try:
            atomic_write_json(path, summary_json(self.session.records))
        except OSError as exc:  # a report must never crash the run
            session.config.issue_config_time_warning(
                pytest.PytestWarning(f"ditgate: could not write {path}: {exc}"), stacklevel=2)
