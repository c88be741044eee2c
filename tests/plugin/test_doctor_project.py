"""``ditgate doctor``'s project section: every bad setting of a project listed at once (a gate run stops at the
first), the quality contract read, and the models its metrics need found where the gate looks for them: a
required metric's missing model is a problem, an optional one's a warning; the classifier is located, not
imported, unless ``--deep``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_ditgate import cli
from pytest_ditgate.doctor_project import check_project

CONTRACT = """
[metrics.class_accuracy]
direction = "higher"
min = 0.5
[metrics.class_accuracy.numerical]
abs = 0.02

[metrics.lpips]
direction = "lower"
required = false
[metrics.lpips.numerical]
max = 0.05

[metrics.rel_l2]
direction = "lower"
[metrics.rel_l2.exact]
max = 0.0
"""

SCORER = """
MARK = __import__("pathlib").Path(__file__).with_name("imported.marker")
MARK.write_text("imported")


class Scorer:
    def __init__(self, device):
        self.device = device

    def logits(self, images):
        return images

    def features(self, images):
        return images

    def reference_statistics(self):
        return None, None


def good(device):
    return Scorer(device)


def broken(device):
    raise RuntimeError("the scorer's weights file is truncated")
"""


def project(root: Path, settings: str, files: dict[str, str] | None = None) -> Path:
    (root / "pyproject.toml").write_text(settings)
    for name, text in (files or {}).items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_every_bad_setting_is_listed_at_once(tmp_path: Path) -> None:
    root = project(tmp_path, """
[tool.ditgate]
mutable_paths = ["kernals/"]
fixed_paths = ["golden/"]
quality_contract = "fixtures/contract.toml"
artefact_folder = ".ditgate"

[tool.ditgate.lanes.fwd]
tests = ["tests/test_fwd.py", "tests/test_speed.py"]
timing = "tests/timing.py"
""", {"kernels/__init__.py": "", "golden/.keep": "", "tests/test_fwd.py": "", "tests/timing.py": "X = 1\n"})
    report = check_project(root)
    text = "\n".join(report.problems)
    assert "unknown key 'artefact_folder'" in text and "did you mean 'artefact_dir'" in text
    assert "mutable_paths names 'kernals/', which does not exist" in text and "kernels/" in text
    assert "[tool.ditgate.lanes.fwd] tests names 'tests/test_speed.py', which does not exist" in text
    assert "tests/timing.py" in text and "declares no REGIONS" in text
    assert "quality contract" in text and "contract.toml does not exist" in text
    assert report.lanes == ["fwd"]
    assert "fixed_paths: 1 of 1 present" in report.checked


def test_the_command_exits_1_and_names_the_projects_problems(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    project(tmp_path, '[tool.pytest.ini_options]\n[tool.ditgate]\nmutable_paths = ["nowhere/"]\n')
    monkeypatch.chdir(tmp_path)
    assert cli.main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert f"project     {tmp_path}" in out
    assert "mutable_paths names 'nowhere/', which does not exist" in out
    assert "status: NOT READY" in out
    assert cli.main(["doctor", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["project"]["root"] == str(tmp_path) and data["ok"] is False
    assert any("nowhere/" in problem for problem in data["project"]["problems"])


def test_a_required_metrics_missing_classifier_is_a_problem_and_an_optional_metrics_weights_a_warning(
        tmp_path: Path) -> None:
    root = project(tmp_path, '[tool.ditgate]\nquality_contract = "contract.toml"\nclassifier = "scorerz:good"\n'
                             'lpips_weights = "weights/"\n', {"contract.toml": CONTRACT, "scorer.py": SCORER})
    report = check_project(root)
    [problem] = report.problems
    assert "the project's classifier for class_accuracy" in problem
    assert "classifier factory 'scorerz:good': no module 'scorerz'" in problem
    assert "(required: class_accuracy fail without it)" in problem
    lpips = [w for w in report.warnings if w.startswith("LPIPS weights for lpips")]
    assert lpips and "(optional: skipped without it)" in lpips[0]
    assert "does not exist" in lpips[0] or "not installed" in lpips[0]


def test_the_classifier_is_located_without_being_imported_and_built_with_deep(tmp_path: Path) -> None:
    root = project(tmp_path, '[tool.ditgate]\nquality_contract = "contract.toml"\nclassifier = "scorer_mod:good"\n',
                   {"contract.toml": CONTRACT, "scorer_mod.py": SCORER})
    report = check_project(root)
    assert report.problems == []
    assert any("scorer_mod:good (module" in line and "--deep builds it" in line for line in report.checked)
    assert not (root / "imported.marker").exists()
    deep = check_project(root, deep=True)
    assert deep.problems == []
    assert any("scorer_mod:good: built on the CPU, a Scorer" in line for line in deep.checked)
    assert (root / "imported.marker").exists()


def test_a_classifier_that_fails_to_build_shows_only_with_deep(tmp_path: Path) -> None:
    root = project(tmp_path, '[tool.ditgate]\nquality_contract = "contract.toml"\nclassifier = "scorer_bad:broken"\n',
                   {"contract.toml": CONTRACT, "scorer_bad.py": SCORER})
    assert check_project(root).problems == []
    [problem] = check_project(root, deep=True).problems
    assert "the scorer's weights file is truncated" in problem and "required: class_accuracy" in problem


def test_an_unreadable_pyproject_and_a_broken_contract_are_named(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.ditgate\n")
    [problem] = check_project(tmp_path).problems
    assert "pyproject.toml: cannot parse" in problem
    root = tmp_path / "other"
    root.mkdir()
    project(root, "", {"fixtures/quality_contract.toml": "[metrics.psnr]\ndirection = 3\n"})
    report = check_project(root)
    assert report.contract == str(root / "fixtures" / "quality_contract.toml")
    assert any("quality_contract.toml: metrics.psnr.direction must be" in p for p in report.problems)


def test_a_project_without_settings_is_checked_against_the_packaged_contract(tmp_path: Path) -> None:
    report = check_project(tmp_path)
    assert report.pyproject is None and report.problems == []
    assert report.contract is not None and report.contract.endswith(".toml")
    assert any(line.startswith("quality contract") for line in report.checked)


def test_a_table_that_fails_its_checks_still_gets_the_whole_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Every other ``ditgate`` command stops at a bad ``[tool.ditgate]`` (exit 4); the doctor reports it with the
    rest, in the default artefact folder, each problem once."""
    project(tmp_path, '[tool.pytest.ini_options]\n[tool.ditgate]\nmutable_paths = "kernels/"\n'
                      '[tool.ditgate.lanes]\nfwd = 3\nbwd = { tests = "x.py" }\n')
    monkeypatch.chdir(tmp_path)
    assert cli.main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert f"artefacts (--ditgate-dir / DITGATE_DIR): {tmp_path / '.ditgate'}" in out
    assert "mutable_paths must be a list of non-empty strings, got 'kernels/'" in out
    assert out.count("[tool.ditgate.lanes.bwd] tests must be a list of non-empty strings") == 1
    assert "did you mean 'fwd'" not in out


def test_the_libraries_under_test_must_be_installed_as_listed(tmp_path: Path) -> None:
    root = project(tmp_path, '[tool.ditgate]\npackages = ["pytest>=1.0", "pytest<1.0", "no-such-dist-ditgate"]\n')
    report = check_project(root)
    assert "packages: 1 of 3 installed as listed" in report.checked
    text = "\n".join(report.problems)
    assert "packages: pytest<1.0 (found " in text
    assert "packages: no-such-dist-ditgate (not installed)" in text
    assert "pytest>=1.0" not in text
