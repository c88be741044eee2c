"""``ditgate doctor``'s project section: every ``[tool.ditgate]`` setting checked at once, each file it names looked
up, the quality contract read, and the models its metrics need found where the gate run will look for them.

A ``pytest --ditgate`` run stops at the first bad setting, and a missing model shows only when a metric needs it,
minutes into a run; the doctor lists them all before anything runs. It reads and looks up only: the optional
packages (lpips, open_clip) and the project's classifier are located, not imported, unless ``deep``, which
imports the classifier's module and builds it on the CPU, as the quality gate will.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pytest_ditgate.errors import DitgateUsageError

#: what each model a metric needs is called in messages, and how the gate treats a missing one
NEEDS = {"lpips": "LPIPS weights", "clip": "CLIP weights", "classifier": "the project's classifier"}


@dataclass
class ProjectReport:
    """The project's settings as the doctor found them: what was checked (one line each), problems (a gate run
    fails on them) and warnings (optional metrics that will skip)."""

    root: str
    pyproject: str | None
    lanes: list[str] = field(default_factory=list)
    contract: str | None = None
    checked: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"root": self.root, "pyproject": self.pyproject, "lanes": self.lanes, "contract": self.contract,
                "checked": self.checked, "problems": self.problems, "warnings": self.warnings}


def check_project(root: Path, *, deep: bool = False) -> ProjectReport:
    """Check the project at ``root``: its ``[tool.ditgate]`` table, the paths and lanes it names, its quality
    contract and the models the contract's metrics need."""
    from pytest_ditgate.project_config import read_pyproject

    path = root / "pyproject.toml"
    report = ProjectReport(root=str(root), pyproject=str(path) if path.is_file() else None)
    try:
        data = read_pyproject(path)
        tool = data.get("tool", {})
    except DitgateUsageError as exc:
        report.problems.append(str(exc))
        return report
    table = tool.get("ditgate", {}) if isinstance(tool, dict) else {}
    if not isinstance(table, dict):
        report.problems.append(f"{path}: [tool.ditgate] must be a table, got {table!r}")
        return report
    _check_settings(report, root, table, data)
    _check_lanes(report, root, table)
    contract = _check_contract(report, root, table)
    if contract is not None:
        _check_models(report, root, table, contract, deep=deep)
    return report


def _check_settings(report: ProjectReport, root: Path, table: dict[str, Any], pyproject: dict[str, Any]) -> None:
    from pytest_ditgate.project_config import missing_paths, project_problems
    from pytest_ditgate.project_paths import golden_dir_problem

    problems = project_problems(table, root)
    golden = golden_dir_problem(root, pyproject, table)
    problems += [golden] if golden else []
    report.problems += [f"{report.pyproject}: {problem}" for problem in problems]
    report.checked.append(f"[tool.ditgate]: {len(table)} setting(s), "
                          + ("every one well-formed" if not problems else f"{len(problems)} problem(s)"))
    for key in ("mutable_paths", "fixed_paths"):
        entries = table.get(key)
        if isinstance(entries, list) and all(isinstance(entry, str) and entry.strip() for entry in entries):
            missing = missing_paths(root, entries, f"[tool.ditgate] {key}")
            report.problems += missing
            report.checked.append(f"{key}: {len(entries) - len(missing)} of {len(entries)} present")
    packages = table.get("packages")
    if isinstance(packages, list) and packages and all(isinstance(entry, str) and entry.strip() for entry in packages):
        from pytest_ditgate.requirements import missing_packages

        try:
            unmet = missing_packages([entry.strip() for entry in packages])
        except DitgateUsageError as exc:
            unmet = [str(exc)]
        report.problems += [f"[tool.ditgate] packages: {entry}: the library under test is not here" for entry in unmet]
        report.checked.append(f"packages: {len(packages) - len(unmet)} of {len(packages)} installed as listed")


def _check_lanes(report: ProjectReport, root: Path, table: dict[str, Any]) -> None:
    from pytest_ditgate.project_config import missing_paths, timing_module_problem
    from pytest_ditgate.verdict.lane import load_lane

    lanes = table.get("lanes")
    if not isinstance(lanes, dict):
        return
    for name, lane in lanes.items():
        report.lanes.append(name)
        if not isinstance(lane, dict):
            continue  # the settings' check names it
        try:
            spec = load_lane(table, name)
        except DitgateUsageError as exc:
            if not any(problem.endswith(str(exc)) for problem in report.problems):  # not the settings' check again
                report.problems.append(str(exc))
            continue
        where = f"[tool.ditgate.lanes.{name}]"
        problems = missing_paths(root, list(spec.tests), f"{where} tests")
        if spec.timing is not None:
            missing_timing = missing_paths(root, [spec.timing], f"{where} timing")
            timing = missing_timing or [timing_module_problem(root, spec.timing, f"{where} timing")]
            problems += [problem for problem in timing if problem]
        report.problems += problems
        report.checked.append(f"lane {name}: class {spec.default_class}, objective {spec.objective}, "
                              f"{len(spec.tests)} test path(s)" + (", timed by " + spec.timing if spec.timing else "")
                              + ("" if not problems else f": {len(problems)} problem(s)"))


def _check_contract(report: ProjectReport, root: Path, table: dict[str, Any]) -> Any:
    """The project's quality contract, read and validated (None where it cannot be)."""
    from pytest_ditgate.quality.contract import contract_path_for, load_contract

    raw = table.get("quality_contract")
    path = contract_path_for(root, raw if isinstance(raw, str) and raw.strip() else None)
    report.contract = str(path)
    try:
        contract = load_contract(path)
    except DitgateUsageError as exc:
        report.problems.append(str(exc))
        return None
    try:
        fixed = path.resolve().is_relative_to(root.resolve())
    except OSError:
        fixed = False
    report.checked.append(f"quality contract {path}: classes {', '.join(contract.covered()) or 'none'}"
                          + ("; a fixed path (the lock covers it)" if fixed else ""))
    return contract


def _check_models(report: ProjectReport, root: Path, table: dict[str, Any], contract: Any, *, deep: bool) -> None:
    """Each model a metric of the contract needs, found (or not) as the gate will look for it: missing, it fails
    a required metric's test and skips an optional one's."""
    from pytest_ditgate.quality.perceptual import WeightsConfig

    weights = WeightsConfig.from_settings(root, table)
    users: dict[str, dict[str, bool]] = {}  # need -> metric -> required under some class
    for rules in contract.rules_by_class.values():
        for rule in rules:
            if rule.spec.needs:
                metrics = users.setdefault(rule.spec.needs, {})
                metrics[rule.metric] = metrics.get(rule.metric, False) or rule.required
    if weights.classifier and "classifier" not in users:
        users["classifier"] = {}  # configured: checked even where no metric needs it
    finders: dict[str, Callable[[], str]] = {"lpips": lambda: _lpips(weights.lpips),
                                            "clip": lambda: _clip(weights),
                                            "classifier": lambda: _classifier(weights, deep=deep)}
    for need, metrics in sorted(users.items()):
        names = ", ".join(sorted(metrics)) or "no metric of the contract"
        try:
            found = finders[need]()
        except Exception as exc:  # MissingWeights, a usage error, or the project's own factory failing
            message = f"{NEEDS[need]} for {names}: {exc}"
            required = [metric for metric, needed in metrics.items() if needed]
            if required:
                report.problems.append(message + f" (required: {', '.join(sorted(required))} fail without it)")
            else:
                report.warnings.append(message + " (optional: skipped without it)")
            continue
        report.checked.append(f"{NEEDS[need]} for {names}: {found}")


def _lpips(setting: str | None) -> str:
    from pytest_ditgate.quality.perceptual import lpips_files

    spec = importlib.util.find_spec("lpips")
    if spec is None or not spec.submodule_search_locations:
        raise DitgateUsageError("the lpips package is not installed (pip install lpips)")
    backbone, linear = lpips_files(setting, package_dir=Path(next(iter(spec.submodule_search_locations))))
    return f"{backbone} and {linear}"


def _clip(weights: Any) -> str:
    from pytest_ditgate.quality.perceptual import clip_source

    if importlib.util.find_spec("open_clip") is None:
        raise DitgateUsageError("the open-clip-torch package is not installed (pip install open-clip-torch)")
    model, checkpoint = clip_source(weights)
    return f"{model} from {checkpoint}"


def _classifier(weights: Any, *, deep: bool) -> str:
    """Where the classifier's module is (located without importing it); with ``deep``, the classifier built on
    the CPU with the methods the metrics call."""
    from pytest_ditgate.quality.learned import HOW_CLASSIFIER, build_classifier

    spec = weights.classifier
    if not spec:
        raise DitgateUsageError(f"no classifier is configured; {HOW_CLASSIFIER}")
    module_name = spec.partition(":")[0]
    added = weights.root and weights.root not in sys.path
    if added:
        sys.path.append(weights.root)  # the project's own package, as the gate run finds it
    try:
        try:
            found = importlib.util.find_spec(module_name)
        except (ImportError, ValueError) as exc:  # a parent package that fails to import, or is no package
            raise DitgateUsageError(f"classifier factory {spec!r}: cannot locate {module_name!r} ({exc})") from None
        if found is None:
            raise DitgateUsageError(f"classifier factory {spec!r}: no module {module_name!r} (from the project root "
                                    f"{weights.root} or the environment)")
        if not deep:
            return f"{spec} (module {found.origin}; ditgate doctor --deep builds it)"
        classifier = build_classifier(spec, "cpu", weights.root)
        return f"{spec}: built on the CPU, a {type(classifier).__name__}"
    finally:
        if added:
            sys.path.remove(weights.root)  # a module the check imported stays imported; the path goes
