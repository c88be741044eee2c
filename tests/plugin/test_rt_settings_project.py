"""Red-team round on settings: bad values of a class the schema let through, each refused at start with exit 4 in
one line naming the setting, nothing written first. Classes: a file setting leading out of the project (``..``, an
absolute path elsewhere) for every key naming project files; a lane name that cannot name a history file and git
ref (or that differs from another only in case); a ``packages`` entry that is no distribution name; a lock path
that is a folder; an ini value of the wrong TOML type; an option given an empty value (an unset variable)."""

from __future__ import annotations

from pathlib import Path

import pytest

NEVER = "def test_never_runs(): raise SystemExit('ran')"
LANE = '[tool.ditgate.lanes.fwd]\ntests = ["test_settings.py"]\n'


def _refused(pytester: pytest.Pytester, args: list[str], message: str) -> None:
    result = pytester.runpytest("--ditgate", "-p", "no:cacheprovider", *args)
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out
    result.stderr.fnmatch_lines([message])
    assert "INTERNALERROR" not in out and "Traceback" not in out and "ran" not in result.stdout.str()
    written = sorted(p.relative_to(pytester.path).as_posix() for p in pytester.path.rglob("*")
                     if p.name not in ("test_settings.py", "pyproject.toml") and "reference" not in p.parts
                     and "__pycache__" not in p.parts and ".benchmarks" not in p.parts)
    assert written == [], written  # no .ditgate, no lock


def _outside(where: str, key: str, entry: str) -> str:
    return f"*{where} {key} names {entry!r}, outside the project *: the lock and the judge see only the project's files*"


@pytest.mark.parametrize(("table", "message"), [
    ('[tool.ditgate]\nfixed_paths = ["../"]\n', _outside("[[]tool.ditgate[]]", "fixed_paths", "../")),
    ('[tool.ditgate]\nfixed_paths = ["reference/../../x"]\n',
     _outside("[[]tool.ditgate[]]", "fixed_paths", "reference/../../x")),
    ('[tool.ditgate]\nfixed_paths = ["/etc/hostname"]\n', _outside("[[]tool.ditgate[]]", "fixed_paths", "/etc/hostname")),
    ('[tool.ditgate]\nmutable_paths = ["../elsewhere/"]\n',
     _outside("[[]tool.ditgate[]]", "mutable_paths", "../elsewhere/")),
    ('[tool.ditgate]\nmutable_paths = ["/tmp"]\n', _outside("[[]tool.ditgate[]]", "mutable_paths", "/tmp")),
    ('[tool.ditgate]\nfixed_paths_lock = "../../lock.json"\n',
     _outside("[[]tool.ditgate[]]", "fixed_paths_lock", "../../lock.json")),
    ('[tool.ditgate.lanes.fwd]\ntests = ["../x/test_y.py"]\n',
     _outside("[[]tool.ditgate.lanes.fwd[]]", "tests", "../x/test_y.py")),
    ('[tool.ditgate.lanes.fwd]\ntests = ["/etc/hostname::test_a"]\n',
     _outside("[[]tool.ditgate.lanes.fwd[]]", "tests", "/etc/hostname::test_a")),
    (LANE + 'timing = "../timing.py"\n', _outside("[[]tool.ditgate.lanes.fwd[]]", "timing", "../timing.py")),
    ('[tool.ditgate.lanes."a/b"]\ntests = ["test_settings.py"]\n',
     "*[[]tool.ditgate.lanes[]] lane name 'a/b' is not a valid lane name: use letters, digits*"),
    ('[tool.ditgate.lanes.".."]\ntests = ["test_settings.py"]\n', "*lane name '..' is not a valid lane name*"),
    ('[tool.ditgate.lanes.""]\ntests = ["test_settings.py"]\n', "*lane name '' is not a valid lane name*"),
    ('[tool.ditgate.lanes."my lane"]\ntests = ["test_settings.py"]\n', "*lane name 'my lane' is not a valid*"),
    ('[tool.ditgate.lanes."fwd.lock"]\ntests = ["test_settings.py"]\n', "*lane name 'fwd.lock' is not a valid*"),
    (LANE + '[tool.ditgate.lanes.FWD]\ntests = ["test_settings.py"]\n',
     "*lanes 'fwd' and 'FWD' differ only in case*"),
    ('[tool.ditgate]\npackages = ["liger kernel"]\n',
     "*[[]tool.ditgate[]] packages must be a list of distribution names as pip has them*got [[]'liger kernel'[]]"),
    ('[tool.ditgate]\npackages = ["triton>=3.0", "-x"]\n', "*packages must be a list of distribution names*"),
    ('[tool.ditgate]\nfixed_paths = ["reference/"]\nfixed_paths_lock = "reference"\n',
     "ERROR: *[[]tool.ditgate[]] fixed_paths_lock names 'reference', which is not a .json file*"),
    ('[tool.ditgate]\nclassifier = "dit_impl/shapes/scorer.py"\n',
     "*[[]tool.ditgate[]] classifier must be a factory written 'package.module:callable', got 'dit_impl/shapes/scorer.py'"),
    ('[tool.ditgate]\nclassifier = "scorer"\n', "*classifier must be a factory written 'package.module:callable'*"),
    ('[tool.pytest.ini_options]\nditgate_bench_budget_ms = [1, 2]\n',
     "ERROR: ini option ditgate_bench_budget_ms=[[]1, 2[]]: must be one value (a string, number or boolean), not a list"),
    ('[tool.pytest.ini_options]\nditgate_kernel_trials = {n = 3}\n', "ERROR: ini option ditgate_kernel_trials=*: invalid literal for int()*"),
])
def test_a_setting_of_a_class_the_schema_missed_is_refused_at_start(pytester: pytest.Pytester, table: str,
                                                                    message: str) -> None:
    pytester.makepyfile(test_settings=NEVER)
    pytester.mkdir("reference").joinpath("work.py").write_text("")
    pytester.makepyprojecttoml(table)
    _refused(pytester, [], message)


@pytest.mark.parametrize("flag", ["--ditgate-golden-dir", "--ditgate-dir", "--ditgate-target", "--ditgate-contract",
                                  "--ditgate-verdict-json", "--ditgate-lane", "--ditgate-classifier"])
def test_an_option_given_an_empty_value_is_refused(pytester: pytest.Pytester, flag: str) -> None:
    """``--ditgate-golden-dir=$GOLDEN`` with the variable unset ran against the default store."""
    pytester.makepyfile(test_settings=NEVER)
    pytester.makepyprojecttoml("[tool.pytest.ini_options]\n")
    _refused(pytester, [f"{flag}= "], f"ERROR: {flag} is given an empty value (an unset variable in a script?)*")


def test_honest_settings_still_run(pytester: pytest.Pytester) -> None:
    """Inner dots in a lane name, an absolute path inside the project, a spec'd package, a TOML number ini value,
    and an empty description are accepted."""
    pytester.makepyfile(test_settings="def test_ok(): pass")
    pytester.mkdir("reference").joinpath("work.py").write_text("")
    inside = Path(pytester.path, "reference").as_posix()
    pytester.makepyprojecttoml(
        '[tool.pytest.ini_options]\nditgate_bench_budget_ms = 50\n'
        f'[tool.ditgate]\nfixed_paths = ["{inside}/", "reference/../reference/work.py"]\n'
        'packages = ["pytest>=7", "safetensors"]\nmutable_paths = ["cand/"]\nclassifier = "my_pkg.scoring:build"\n'
        '[tool.ditgate.lanes."dit-xl.v2"]\ntests = ["test_settings.py"]\n')
    assert pytester.runpytest("--ditgate", "--ditgate-relock", "-p", "no:cacheprovider").ret == 0
    result = pytester.runpytest("--ditgate", "--ditgate-description=", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


@pytest.mark.parametrize(("table", "args", "env", "source"), [
    ("[tool.pytest.ini_options]\n", ["--ditgate-dir=test_settings.py/out"], {}, "--ditgate-dir=test_settings.py/out"),
    ("[tool.pytest.ini_options]\n", [], {"DITGATE_DIR": "test_settings.py/a/b"}, "DITGATE_DIR=test_settings.py/a/b"),
    ('[tool.ditgate]\nartefact_dir = "test_settings.py/x"\n', [], {}, "[[]tool.ditgate[]] artefact_dir"),
    ("[tool.pytest.ini_options]\n", ["--ditgate-golden-dir=test_settings.py/g", "--ditgate-freeze"], {},
     "--ditgate-golden-dir=test_settings.py/g"),
])
def test_a_folder_setting_under_a_file_is_refused(pytester: pytest.Pytester, monkeypatch, table: str, args: list[str],
                                                  env: dict[str, str], source: str) -> None:
    """It passed the start (the folder is inside the project, so ditgate would make it), then every write failed:
    environment.json with a warning only, a freeze with nothing written and the tests green."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    pytester.makepyfile(test_settings=NEVER)
    pytester.makepyprojecttoml(table)
    _refused(pytester, args, f"ERROR: {source}: */test_settings.py is a file, so no folder */test_settings.py/* can be "
                             "made under it; check the path")


@pytest.mark.parametrize(("name", "meant"), [("DITGATE_DIRR", "DITGATE_DIR"), ("DITGATE_DEVICE_PROFIL", "DITGATE_DEVICE_PROFILE"),
                                             ("DITGATE_PROFILE", "DITGATE_DEVICE_PROFILE"), ("DITGATE_DIRS", "DITGATE_DIR")])
def test_a_misspelt_ditgate_variable_is_refused(pytester: pytest.Pytester, monkeypatch, name: str, meant: str) -> None:
    """``DITGATE_PROFILE=h200`` ran on the real device (no profile): the skip decisions CI meant to exercise did not
    happen, and the run was green."""
    monkeypatch.setenv(name, "h200")
    pytester.makepyfile(test_settings=NEVER)
    pytester.makepyprojecttoml("[tool.pytest.ini_options]\n")
    _refused(pytester, [], f"ERROR: environment variable {name}: not a ditgate variable; did you mean {meant!r}?")


def test_a_projects_own_ditgate_variables_are_left_alone(pytester: pytest.Pytester, monkeypatch) -> None:
    for name in ("DITGATE_KERNELS_ARCHS", "DITGATE_KERNELS_CACHE_DIR", "DITGATE_CORPUS_SHARD", "DITGATE_API"):
        monkeypatch.setenv(name, "1")
    pytester.makepyfile(test_settings="def test_ok(): pass")
    pytester.makepyprojecttoml("[tool.pytest.ini_options]\n")
    pytester.runpytest("--ditgate", "-p", "no:cacheprovider").assert_outcomes(passed=1)
