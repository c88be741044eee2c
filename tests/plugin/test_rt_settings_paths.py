"""Red-team round on the roles of the paths ``[tool.ditgate]`` names: a lock that names another file (pyproject.toml,
a source, the golden manifest) was overwritten with the lock's JSON; a quality contract inside a mutable path, or
outside the project, was loosened by the candidate it judged; an artefact folder at the root or inside the golden
store or a fixed path was committed by the baseline; ``./candidate/`` or an absolute path made every honest edit
out of scope; a hand-edited lock gave a traceback. Each is refused at start (exit 4, one line naming the setting)
or, for a lock, named with its bad field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# --ditgate runs probe the device (torch); import it here once, since in-process pytester runs drop
# modules they imported and torch cannot be imported a second time in one process
pytest.importorskip("torch")

TEST = "def test_ok(): pass"
CONTRACT = '[contract]\nversion = 1\n\n[metrics.rel_l2]\ndirection = "lower"\n[metrics.rel_l2.exact]\nmax = {max}\n'
CONTRACT += "".join(f'[metrics.rel_l2.{cls}]\nmax = {{max}}\n' for cls in ("numerical", "approximate", "quantization"))


def _project(pytester: pytest.Pytester, table: str) -> None:
    pytester.makepyfile(test_settings=TEST)
    for folder in ("reference", "candidate", "fixtures", "golden"):
        pytester.mkdir(folder)
    (pytester.path / "reference" / "work.py").write_text("W = 1\n")
    (pytester.path / "candidate" / "impl.py").write_text("X = 1\n")
    (pytester.path / "golden" / "manifest.json").write_text('{"entries": {}}\n')
    (pytester.path / "fixtures" / "data.json").write_text('{"seed": 1}\n')
    pytester.makepyprojecttoml(table)


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


def _refused(pytester: pytest.Pytester, args: list[str], message: str) -> None:
    before = _snapshot(pytester.path)
    result = pytester.runpytest("--ditgate", "-p", "no:cacheprovider", *args)
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out
    result.stderr.fnmatch_lines([message])
    assert "Traceback" not in out and "INTERNALERROR" not in out
    assert _snapshot(pytester.path) == before  # nothing written, nothing overwritten


BASE = '[tool.ditgate]\nmutable_paths = ["candidate/"]\nfixed_paths = ["reference/"]\n'


@pytest.mark.parametrize(("setting", "message"), [
    ('fixed_paths_lock = "pyproject.toml"', "*fixed_paths_lock names 'pyproject.toml', a configuration file ditgate "
                                            "would overwrite*"),
    ('fixed_paths_lock = "reference/work.py"', "*fixed_paths_lock names 'reference/work.py', which is not a .json*"),
    ('fixed_paths_lock = "golden/manifest.json"', "*fixed_paths_lock names 'golden/manifest.json', a file of the "
                                                  "golden store*"),
    ('fixed_paths_lock = "candidate/lock.json"', "*fixed_paths_lock names 'candidate/lock.json', inside the mutable "
                                                 "path 'candidate/'*"),
    ('fixed_paths_lock = "fixtures/data.json"', "*--ditgate-relock: refusing to overwrite *data.json, which "
                                                "cannot be read as a fixed-paths lock (not a fixed-paths lock: "
                                                "'files' must be*"),
    ('quality_contract = "candidate/contract.toml"', "*quality_contract names 'candidate/contract.toml', inside the "
                                                     "mutable path 'candidate/'*"),
    ('quality_contract = "../shared_contract.toml"', "*quality_contract names '../shared_contract.toml', outside the "
                                                     "project*"),
    ('artefact_dir = "."', "*artefact_dir names '.', the project root*"),
    ('artefact_dir = "golden"', "*artefact_dir names 'golden', which overlaps the golden store*"),
    ('artefact_dir = "reference/art"', "*artefact_dir names 'reference/art', which overlaps the fixed path "
                                       "'reference/'*"),
    ('artefact_dir = "candidate/art"', "*artefact_dir names 'candidate/art', which overlaps the mutable path*"),
    ('artefact_dir = "./golden/"', "*artefact_dir names './golden/', which overlaps the golden store*"),
])
def test_a_path_given_a_role_it_cannot_play_is_refused_and_nothing_is_overwritten(
        pytester: pytest.Pytester, setting: str, message: str) -> None:
    _project(pytester, BASE + setting + "\n")
    _refused(pytester, ["--ditgate-relock", "--co"], message)


def test_the_artefact_dir_may_be_outside_the_project(pytester: pytest.Pytester, tmp_path_factory) -> None:
    outside = tmp_path_factory.mktemp("scratch")
    _project(pytester, BASE + f'artefact_dir = "{outside.as_posix()}"\n')
    pytester.runpytest("--ditgate", "--ditgate-relock", "-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_the_quality_contract_is_a_fixed_path_by_default(pytester: pytest.Pytester) -> None:
    """A candidate that loosens the contract changes a fixed path: the lock names it, configured or default."""
    _project(pytester, BASE)
    contract = pytester.path / "fixtures" / "quality_contract.toml"
    contract.write_text(CONTRACT.format(max="0.0"))
    pytester.runpytest("--ditgate", "--ditgate-relock", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    lock = json.loads((pytester.path / "golden" / "fixed_paths.lock.json").read_text())
    assert "fixtures/quality_contract.toml" in lock["files"]
    contract.write_text(CONTRACT.format(max="1.0"))  # loosened
    result = pytester.runpytest("--ditgate", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*edited:  fixtures/quality_contract.toml*"])


@pytest.mark.parametrize("entry", ["./candidate/", "{root}/candidate/", "candidate/./"])
def test_path_entries_are_made_project_relative(pytester: pytest.Pytester, entry: str) -> None:
    from pytest_ditgate.golden.fixed_paths import LockSettings
    from pytest_ditgate.project_config import load_project_config

    root = pytester.path
    _project(pytester, '[tool.ditgate]\nmutable_paths = ["{0}"]\nfixed_paths = ["{1}"]\n'.format(
        entry.format(root=root.as_posix()), entry.replace("candidate", "reference").format(root=root.as_posix())))
    table = load_project_config(root)
    assert table["mutable_paths"] == ["candidate/"] and table["fixed_paths"] == ["reference/"]
    assert LockSettings.from_rootdir(root).patterns[-1] == "reference/"


BAD_LOCKS = [
    ({"version": 1, "patterns": [], "files": {}, "lanes": {"fwd": None}}, "'lanes.fwd' must be a table"),
    ({"version": 1, "patterns": [], "files": {}, "lanes": "x"}, "'lanes' must be a table"),
    ({"genesis": 5}, "'files' must be a table"),
    ({"version": 1, "patterns": 5, "files": {}}, "'patterns' must be a list of strings"),
    ({"version": 1, "patterns": [], "files": {}, "lanes": {"fwd": {"genesis": 5}}}, "'lanes.fwd' must be a table"),
    ([1, 2], "holds list, not a JSON object"),
]


@pytest.mark.parametrize(("data", "field"), BAD_LOCKS)
def test_a_hand_edited_lock_is_named_with_its_bad_field(tmp_path: Path, data, field: str) -> None:
    from pytest_ditgate.errors import DitgateUsageError
    from pytest_ditgate.golden.fixed_paths import LockSettings, evaluate_lock, read_lock, write_lock

    (tmp_path / "golden").mkdir()
    settings = LockSettings(tmp_path, ("pyproject.toml#tool.ditgate",), tmp_path / "golden" / "fixed_paths.lock.json")
    settings.lock_path.write_text(json.dumps(data))
    verdict = evaluate_lock(settings)
    assert verdict.changed and field in verdict.unreadable
    assert str(settings.lock_path) in verdict.lines()[0]
    # the judge's read of a lane's genesis: no AttributeError on a hand-edited lock
    assert (read_lock(settings).get("lanes") or {}).get("fwd", {}).get("genesis") is None
    with pytest.raises(DitgateUsageError, match="refusing to overwrite"):
        write_lock(settings)
    assert json.loads(settings.lock_path.read_text()) == data


def test_a_hand_edited_lock_stops_a_session_without_a_traceback(pytester: pytest.Pytester) -> None:
    _project(pytester, BASE)
    lock = pytester.path / "golden" / "fixed_paths.lock.json"
    lock.write_text(json.dumps({"version": 1, "patterns": 5, "files": {}}))
    result = pytester.runpytest("--ditgate", "-p", "no:cacheprovider")
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED and "Traceback" not in out
    result.stdout.fnmatch_lines(["*cannot verify the fixed paths: fixed-paths lock *fixed_paths.lock.json is "
                                 "unreadable (not a fixed-paths lock: 'patterns' must be a list of strings, got 5)*"])


def test_the_doctor_names_a_contract_in_a_mutable_path(tmp_path: Path) -> None:
    from pytest_ditgate.doctor_project import check_project

    (tmp_path / "candidate").mkdir()
    (tmp_path / "pyproject.toml").write_text('[tool.ditgate]\nmutable_paths = ["candidate/"]\n'
                                             'quality_contract = "candidate/contract.toml"\n')
    report = check_project(tmp_path)
    assert any("quality_contract names 'candidate/contract.toml', inside the mutable path" in p
               for p in report.problems), report.problems



def test_the_doctor_says_the_contract_is_a_fixed_path(tmp_path: Path) -> None:
    from pytest_ditgate.doctor_project import check_project

    (tmp_path / "fixtures").mkdir()
    (tmp_path / "fixtures" / "quality_contract.toml").write_text(CONTRACT.format(max="0.0"))
    (tmp_path / "pyproject.toml").write_text('[tool.ditgate]\nmutable_paths = ["candidate/"]\n')
    (tmp_path / "candidate").mkdir()
    report = check_project(tmp_path)
    assert any(line.startswith("quality contract") and line.endswith("a fixed path (the lock covers it)")
               for line in report.checked), report.checked


LANES = '[tool.ditgate.lanes.fwd]\ntests = ["test_settings.py"]\n'


def test_a_golden_dir_elsewhere_is_refused_in_a_project_with_lanes(pytester: pytest.Pytester) -> None:
    """The judge reads and locks ``golden/``: a lane's baseline froze into ``store/`` and judged nothing."""
    from pytest_ditgate.doctor_project import check_project

    _project(pytester, BASE + LANES + '[tool.pytest.ini_options]\nditgate_golden_dir = "store"\n')
    _refused(pytester, [], "*[[]tool.pytest.ini_options[]] ditgate_golden_dir = 'store': a project with lanes keeps "
                           "its golden store at golden/*")
    assert any("ditgate_golden_dir = 'store'" in p for p in check_project(pytester.path).problems)


def test_a_golden_dir_named_golden_is_fine(pytester: pytest.Pytester) -> None:
    _project(pytester, BASE + LANES + '[tool.pytest.ini_options]\nditgate_golden_dir = "./golden/"\n')
    pytester.runpytest("--ditgate", "--ditgate-relock", "-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_a_judged_child_refuses_a_golden_dir_from_any_ini_file(pytester: pytest.Pytester,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_ditgate.judged_run import OUT_ENV

    _project(pytester, BASE)
    pytester.makeini("[pytest]\nditgate_golden_dir = store\n")
    (pytester.path / "store").mkdir()
    monkeypatch.setenv(OUT_ENV, str(pytester.path / "out"))
    _refused(pytester, ["--ditgate-freeze"], "*ditgate_golden_dir = store: the judge (ditgate baseline and "
                                             "experiment) reads and locks the golden store at golden/ only*")
