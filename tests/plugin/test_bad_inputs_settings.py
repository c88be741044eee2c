"""Settings that were wrong but passed silently (issue 51, item 6): each is checked when the run or command starts,
exit 4 with one line naming it, nothing written before. Built for the class of mistake: the whole [tool.ditgate]
table against a schema of known keys and types (with a did-you-mean), every ditgate ini key, every lane, every
requires_gpu marker of a test taken together, and every file path an option writes to."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_ditgate import cli

NEVER = "def test_never_runs(): raise SystemExit('ran')"


def _usage_error(result: pytest.RunResult, message: str) -> None:
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    result.stderr.fnmatch_lines([message])
    assert "INTERNALERROR" not in result.stderr.str() and "Traceback" not in result.stderr.str()


def _written(root: Path) -> list[str]:
    """What a run left in the project besides the files the test made."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                  if p.name not in ("test_settings.py", "pyproject.toml") and "reference" not in p.parts
                  and "__pycache__" not in p.parts and ".benchmarks" not in p.parts)  # pytest-benchmark's own


@pytest.mark.parametrize(("table", "message"), [
    ('fixed_path = ["reference/"]',
     "*[[]tool.ditgate[]]: unknown key 'fixed_path'; did you mean 'fixed_paths'? (known: mutable_paths, fixed_paths,*"),
    ('mutable_path = ["candidate/"]', "*unknown key 'mutable_path'; did you mean 'mutable_paths'?*"),
    ("artefact_dir = 5", "*[[]tool.ditgate[]] artefact_dir must be a non-empty string, got 5"),
    ('lanes = "fwd"', "*[[]tool.ditgate[]] lanes must be a table of lane tables, got 'fwd'"),
    ('fixed_paths = "reference/"', "*[[]tool.ditgate[]] fixed_paths must be a list of non-empty strings, got 'reference/'"),
    ('quality_contract = ""', "*[[]tool.ditgate[]] quality_contract must be a non-empty string, got ''"),
    ('[tool.ditgate.lanes.fwd]\ntest = ["test_settings.py"]',
     "*[[]tool.ditgate.lanes.fwd[]]: unknown key 'test'; did you mean 'tests'?*"),
    ('[tool.ditgate.lanes.fwd]\ntests = ["test_settings.py"]\nmin_improvement = 2',
     "*[[]tool.ditgate.lanes.fwd[]] min_improvement must be a number in [[]0, 0.5), got 2 (a fraction: write 0.02 for 2 %)"),
    ('fixed_paths = ["refrence/"]',
     "ERROR: [[]tool.ditgate[]] fixed_paths names 'refrence/', which does not exist under *; did you mean 'reference/'?"),
    ('fixed_paths = ["reference/*.pyi"]',
     "ERROR: [[]tool.ditgate[]] fixed_paths names 'reference/*.pyi', a pattern that matches nothing under *"),
    ('[tool.ditgate.lanes.fwd]\ntests = ["test_setings.py"]',
     "ERROR: [[]tool.ditgate.lanes.fwd[]] tests names 'test_setings.py', which does not exist under *; did you mean "
     "'test_settings.py'?"),
])
def test_a_wrong_project_table_is_a_usage_error_at_start(pytester: pytest.Pytester, table: str, message: str) -> None:
    pytester.makepyfile(test_settings=NEVER)
    pytester.mkdir("reference").joinpath("work.py").write_text("")
    pytester.makepyprojecttoml(f"[tool.ditgate]\n{table}\n")
    _usage_error(pytester.runpytest("--ditgate", "-p", "no:cacheprovider"), message)
    assert _written(pytester.path) == []  # no .ditgate, no lock: nothing written before the error
    # the plugin stays inert without --ditgate: a project's table is not checked on every pytest run
    assert pytester.runpytest("-p", "no:cacheprovider", "--co").ret == pytest.ExitCode.OK


def test_commands_check_the_project_table_too(pytester: pytest.Pytester, capsys) -> None:
    pytester.makepyprojecttoml("[tool.ditgate]\nartefact_dir = 5\n")
    pytester.chdir()
    assert cli.main(["summary"]) == 4
    assert "ditgate summary: error: " in capsys.readouterr().err
    for argv in (["experiment", "--lane", "fwd", "--class", ""], ["experiment", "--lane", "fwd", "--class", "fast"]):
        with pytest.raises(SystemExit) as info:
            cli.main(argv)
        assert info.value.code == 4
        assert "argument --class: invalid choice: " in capsys.readouterr().err


@pytest.mark.parametrize(("lanes", "flag", "message"), [
    ('[tool.ditgate.lanes.fwd]\ntests = ["test_settings.py"]\n', "--ditgate-lane=fdw",
     "ERROR: --ditgate-lane=fdw: lane 'fdw' is not declared in [[]tool.ditgate.lanes[]]; did you mean 'fwd'? (declared: fwd)"),
    ("", "--ditgate-lane=fwd", "ERROR: --ditgate-lane=fwd: lane 'fwd' is not declared in [[]tool.ditgate.lanes[]] (declared: none)"),
    ('[tool.ditgate.lanes.fwd]\ntests = ["test_settings.py"]\n', "--ditgate-min-improvement=2",
     "*--ditgate-min-improvement: must be a number in [[]0, 0.5), got 2.0 (a fraction: write 0.02 for 2 %)"),
    ('[tool.ditgate.lanes.fwd]\ntests = ["test_settings.py"]\n', "--ditgate-min-improvement=-0.1",
     "*--ditgate-min-improvement: must be a number in [[]0, 0.5), got -0.1"),
])
def test_a_wrong_lane_option_is_a_usage_error(pytester: pytest.Pytester, lanes: str, flag: str, message: str) -> None:
    """A typo'd lane had no best, so the advisory verdict read its first run as a KEEP."""
    pytester.makepyfile(test_settings="def test_ok(): pass")
    pytester.makepyprojecttoml(lanes or "[tool.other]\n")
    _usage_error(pytester.runpytest("--ditgate", flag, "-p", "no:cacheprovider"), message)
    assert "VERDICT" not in pytester.runpytest("--ditgate", flag, "-p", "no:cacheprovider").stdout.str()


@pytest.mark.parametrize(("ini", "args", "message"), [
    ("[pytest]\nditgate_bench_budget = 50\n", [],
     "ERROR: ini option ditgate_bench_budget: not a ditgate setting; did you mean 'ditgate_bench_budget_ms'?"),
    ("[pytest]\nditgate_frezze = true\n", [], "ERROR: ini option ditgate_frezze: not a ditgate setting; did you mean 'ditgate_freeze'?"),
    ("[pytest]\n", ["-o", "ditgate_kernel_trial=3"],
     "ERROR: ini option ditgate_kernel_trial: not a ditgate setting; did you mean 'ditgate_kernel_trials'?"),
    ("[pytest]\nditgate_min_improvement = 2\n", [], "ERROR: ini option ditgate_min_improvement='2': must be a number in*"),
])
def test_an_unknown_ditgate_ini_key_is_a_usage_error(pytester: pytest.Pytester, ini: str, args: list[str],
                                                     message: str) -> None:
    pytester.makepyfile(test_settings=NEVER)
    pytester.makeini(ini)
    _usage_error(pytester.runpytest("--ditgate", "-p", "no:cacheprovider", *args), message)


def test_an_unknown_ditgate_key_in_pyproject_ini_options_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_settings=NEVER)
    pytester.makepyprojecttoml('[tool.pytest.ini_options]\nditgate_golden_directory = "g"\n')
    _usage_error(pytester.runpytest("--ditgate", "-p", "no:cacheprovider"),
                 "ERROR: ini option ditgate_golden_directory: not a ditgate setting; did you mean 'ditgate_golden_dir'?")


@pytest.mark.parametrize(("marks", "message"), [
    ('@pytest.mark.requires_gpu(cc=">=9.0")\n@pytest.mark.requires_gpu(cc="<8.0")',
     "*test_k: requires_gpu: no device meets cc='<8.0', cc='>=9.0' together (the test would skip on every device)"),
    ('@pytest.mark.requires_gpu(cc="<8.0", bf16=True)', "*no device meets cc='<8.0', bf16=True (sm>=8.0) together*"),
    ('@pytest.mark.requires_gpu(fp8=True)\n@pytest.mark.requires_gpu(cc="8.0-8.6")',
     "*no device meets cc='8.0-8.6', fp8=True (sm>=8.9) together*"),
    ('@pytest.mark.requires_gpu(triton=">=3.0")\n@pytest.mark.requires_gpu(triton="<2.0")',
     "*no triton version meets '<2.0', '>=3.0' together*"),
    ('@pytest.mark.requires_gpu(packages="quack-kernels>=0.7")\n@pytest.mark.requires_gpu(packages=["quack-kernels<0.6"])',
     "*no version of quack-kernels meets '<0.6', '>=0.7' together*"),
])
def test_stacked_requirements_no_device_meets_are_a_usage_error(pytester: pytest.Pytester, use_profile, marks: str,
                                                                message: str) -> None:
    use_profile("h200")
    pytester.makepyfile(test_settings=f"import pytest\n\n{marks}\ndef test_k():\n    raise SystemExit('ran')\n")
    pytester.makepyprojecttoml('[tool.ditgate]\nfixed_paths = ["test_settings.py"]\n')
    _usage_error(pytester.runpytest("--ditgate", "--ditgate-freeze", "-p", "no:cacheprovider"), message)
    assert _written(pytester.path) == []  # a deliberate run stopped at collection: no artefacts, no new lock


def test_stacked_requirements_a_device_meets_still_run(pytester: pytest.Pytester, use_profile) -> None:
    use_profile("h200")
    pytester.makepyfile(test_settings='import pytest\n\n@pytest.mark.requires_gpu(cc=">=8.0")\n'
                                      '@pytest.mark.requires_gpu(fp8=True, cc="<10.0")\ndef test_k():\n    pass\n')
    pytester.runpytest("--ditgate", "-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_a_verdict_json_is_never_written_into_a_new_folder_chain_outside_the_project(pytester: pytest.Pytester,
                                                                                      tmp_path_factory) -> None:
    pytester.makepyfile(test_settings="def test_ok(): pass")
    pytester.makepyprojecttoml('[tool.ditgate.lanes.fwd]\ntests = ["test_settings.py"]\n')
    outside = tmp_path_factory.mktemp("outside")
    for target in (outside / "deep" / "er" / "v.json", Path("/ditgate-issue51-nonexistent") / "v.json"):
        result = pytester.runpytest("--ditgate", f"--ditgate-verdict-json={target}", "-p", "no:cacheprovider")
        _usage_error(result, f"ERROR: --ditgate-verdict-json={target}: its folder {target.parent} does not exist; ditgate "
                             "creates missing folders for a file only inside the project*")
        assert not target.parent.exists()
    inside = pytester.runpytest("--ditgate", "--ditgate-lane=fwd", "--ditgate-verdict-json=out/deep/v.json",
                                "-p", "no:cacheprovider")
    assert (pytester.path / "out" / "deep" / "v.json").is_file(), inside.stdout.str()


def test_report_out_is_never_written_into_a_new_folder_chain_outside_the_project(pytester: pytest.Pytester,
                                                                                 tmp_path_factory, capsys) -> None:
    pytester.makepyprojecttoml("[tool.pytest.ini_options]\n")
    (pytester.path / ".ditgate").mkdir()
    pytester.chdir()
    outside = tmp_path_factory.mktemp("outside") / "a" / "b" / "report.html"
    assert cli.main(["report", "--out", str(outside)]) == 4
    assert f"--out {outside}: its folder {outside.parent} does not exist" in capsys.readouterr().err
    assert not outside.parent.parent.exists()
    assert cli.main(["report", "--out", "pages/new/report.html"]) == 0  # inside the project: created
    assert (pytester.path / "pages" / "new" / "report.html").is_file()
