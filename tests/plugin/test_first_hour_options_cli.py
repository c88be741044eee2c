"""A new user's first hour with markers, options, profiles and the ``ditgate`` command (issue 37): values
that mean something else are usage errors (exit 4, one line, nothing created), paths behave as the README
says, and the CLI reads the artefact folder pytest writes, from anywhere in the project."""

from __future__ import annotations

import json
import os

import pytest

from pytest_ditgate import __version__, cli
from pytest_ditgate.project_config import find_project_root

NEVER = "def test_never_runs(): raise SystemExit('ran')\n"


def _usage_error(result: pytest.RunResult, *lines: str) -> None:
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    result.stderr.fnmatch_lines(list(lines))
    assert "Traceback" not in result.stderr.str() and "INTERNALERROR" not in result.stderr.str()


# -- 4. values that mean something else ---------------------------------------------------------------

MISSPELT = """
import pytest

@pytest.mark.require_gpu(cc=">=8.0")
def test_a(): pass

@pytest.mark.requires_gpus
def test_b(): pass

@pytest.mark.slow
def test_c(): pass
"""


def test_a_misspelt_marker_is_an_error_that_names_the_real_one(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_marks=MISSPELT)
    result = pytester.runpytest("--ditgate", "-p", "no:cacheprovider")
    _usage_error(result, "ERROR: misspelt marker(s):",
                 "  test_marks.py::test_a: unknown marker 'require_gpu': did you mean requires_gpu? *",
                 "  test_marks.py::test_b: unknown marker 'requires_gpus': did you mean requires_gpu? *")
    assert "test_c" not in result.stderr.str()  # an unrelated unknown marker stays pytest's warning
    # without the gates the plugin is inert: pytest's own warning, the tests run
    plain = pytester.runpytest("-p", "no:cacheprovider")
    plain.assert_outcomes(passed=3)
    plain.stdout.fnmatch_lines(["*Unknown pytest.mark.require_gpu*"])


@pytest.mark.parametrize("cc, forms", [
    ("8.0", "'>=8.0' (this or newer), '==8.0' (exactly), '8.0-8.9' (a range) or 'sm_80'"),
    ("86", "'>=8.6' (this or newer), '==8.6' (exactly), '8.6-8.9' (a range) or 'sm_86'"),
    ("[8.0, '>=9.0']", "'>=8.0' (this or newer)*"),
])
def test_a_bare_number_for_cc_is_refused_with_the_string_forms(pytester: pytest.Pytester, cc: str, forms: str) -> None:
    pytester.makepyfile(test_cc=f"import pytest\n@pytest.mark.requires_gpu(cc={cc})\n{NEVER}")
    result = pytester.runpytest("--ditgate", "-p", "no:cacheprovider")
    _usage_error(result, "ERROR: bad requires_gpu marker(s):",
                 f"  test_cc.py::test_never_runs: requires_gpu(cc=...): a bare number * is ambiguous (this capability "
                 f"or newer? exactly it?); write a string: {forms}")


def test_a_profile_with_several_bad_fields_names_them_all(pytester: pytest.Pytester,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    path = pytester.path / "mine.json"
    path.write_text(json.dumps({"name": "x", "arch": "sm_86", "bf16": "no", "fp8": 1, "memory": 24,
                                "sdpa": {"flashy": True}}))
    monkeypatch.setenv("DITGATE_DEVICE_PROFILE", str(path))
    pytester.makepyfile(test_p=NEVER)
    result = pytester.runpytest("--ditgate", "-p", "no:cacheprovider")
    _usage_error(result, "ERROR: DITGATE_DEVICE_PROFILE=*mine.json*: 4 problems: unknown field(s) memory; allowed: *; "
                         "field 'bf16' must be true or false, got 'no'; field 'fp8' must be true or false, got 1; "
                         "sdpa.flashy = True: backends are flash, efficient, cudnn, math, each true or false")


# -- 6. a profile stands in for skip decisions only ----------------------------------------------------

README_KERNEL = """
import pytest
import torch
from pytest_ditgate.correctness.inputs import make_tensor


def fused_rmsnorm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def reference(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def make_inputs(seed):
    return (make_tensor((33, 1152), "bfloat16", seed=seed, device="cuda"),
            make_tensor((1152,), "bfloat16", seed=seed + 1000, device="cuda"))


@pytest.mark.requires_gpu(bf16=True)
def test_fused_rmsnorm(kernel_check):
    kernel_check(fused_rmsnorm, reference, make_inputs, trials=5)
"""


def test_a_gpu_profile_on_a_machine_without_one_fails_in_one_line(pytester: pytest.Pytester, use_profile) -> None:
    torch = pytest.importorskip("torch")
    use_profile("a5500")
    pytester.makepyfile(test_readme=README_KERNEL)
    result = pytester.runpytest("--ditgate", "-p", "no:cacheprovider")
    if torch.cuda.is_available():  # a GPU host: the profile's skip decision lets it run, and it passes
        result.assert_outcomes(passed=1)
        return
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    result.stdout.fnmatch_lines(["ditgate: DITGATE_DEVICE_PROFILE=a5500 stands in for skip decisions only: it claims "
                                 "NVIDIA RTX A5500 (sm_86), but this machine has no CUDA GPU (*), and this test used "
                                 "CUDA (*). Run it where that GPU is, or without DITGATE_DEVICE_PROFILE*"])
    failure = out.split("_ test_fused_rmsnorm _")[1].split("short test summary")[0]
    assert len([line for line in failure.splitlines() if line.strip(" _=")]) == 1  # one line, no traceback
    assert "Traceback" not in out and "torch/cuda/__init__.py" not in out


# -- 5. paths: what the README says ---------------------------------------------------------------------

def test_an_artefact_dir_outside_the_project_with_no_parent_is_refused(pytester: pytest.Pytester) -> None:
    outside = pytester.path.parent / f"{pytester.path.name}-nowhere" / "deep" / "dir"
    pytester.makepyfile(test_a=NEVER)
    result = pytester.runpytest("--ditgate", "-p", "no:cacheprovider", f"--ditgate-dir={outside}")
    _usage_error(result, f"ERROR: --ditgate-dir={outside}: {outside} does not exist, and neither does its parent "
                         f"folder {outside.parent}: ditgate creates a missing folder inside the project or in an "
                         "existing folder*")
    assert not outside.parent.parent.exists()  # nothing created
    # one new folder in an existing one is fine, and so is any depth inside the project
    beside = pytester.path.parent / f"{pytester.path.name}-artefacts"
    pytester.makepyfile(test_a="def test_ok(): pass\n")
    pytester.runpytest("--ditgate", "-p", "no:cacheprovider", f"--ditgate-dir={beside}").assert_outcomes(passed=1)
    assert (beside / "environment.json").is_file()


def test_a_golden_dir_that_does_not_exist_is_refused_unless_freezing(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_g="""
        import torch
        def test_g(golden):
            golden.check("g", {"x": torch.ones(2)})
    """)
    result = pytester.runpytest("--ditgate", "-p", "no:cacheprovider", "--ditgate-golden-dir=goldne")
    _usage_error(result, "ERROR: --ditgate-golden-dir=goldne: no such folder *goldne; a run that checks goldens reads "
                         "them from an existing golden store (check the path; a new store is made with "
                         "--ditgate-freeze)")
    assert not (pytester.path / "goldne").exists()
    pytester.runpytest("--ditgate", "-p", "no:cacheprovider", "--ditgate-golden-dir=goldne",
                       "--ditgate-freeze").assert_outcomes(passed=1)
    assert (pytester.path / "goldne" / "manifest.json").is_file()
    pytester.runpytest("--ditgate", "-p", "no:cacheprovider", "--ditgate-golden-dir=goldne").assert_outcomes(passed=1)


# -- 5. the CLI reads what pytest writes, from anywhere in the project ------------------------------------

def _project(root) -> None:
    (root / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_x.py").write_text("def test_x(ditgate_artefacts):\n    pass\n")


@pytest.mark.parametrize("layout, expected", [
    ({"pyproject.toml": "[tool.pytest.ini_options]\n"}, "."),
    ({"pyproject.toml": "[project]\nname = 'x'\n"}, "."),        # no pytest section: still the nearest pyproject
    ({"tox.ini": "[pytest]\n", "sub/setup.cfg": "[metadata]\n"}, "."),  # setup.cfg without [tool:pytest]
    ({"pytest.ini": "", "sub/pyproject.toml": "[project]\nname = 'x'\n"}, "."),
    ({"pytest.ini": "", "sub/pytest.ini": ""}, "sub"),
])
def test_the_project_root_is_found_as_pytest_finds_its_rootdir(pytester: pytest.Pytester, layout, expected) -> None:
    for name, text in layout.items():
        (pytester.path / name).parent.mkdir(parents=True, exist_ok=True)
        (pytester.path / name).write_text(text)
    start = pytester.mkdir("sub") if not (pytester.path / "sub").exists() else pytester.path / "sub"
    (start / "deeper").mkdir()
    found = find_project_root(start / "deeper")
    assert found == (pytester.path / expected).resolve()
    pytester.makepyfile(**{"sub/deeper/test_where": "def test_where(request):\n    print('ROOT=' + str(request.config.rootpath))\n"})
    result = pytester.runpytest("-s", "-p", "no:cacheprovider", str(start / "deeper"))
    result.stdout.fnmatch_lines([f"*ROOT={found}"])  # pytest agrees


def test_report_summary_and_doctor_read_the_project_artefacts_from_a_subfolder(pytester: pytest.Pytester,
                                                                               monkeypatch: pytest.MonkeyPatch,
                                                                               capsys) -> None:
    _project(pytester.path)
    pytester.runpytest("--ditgate", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    artefacts = pytester.path / ".ditgate"
    assert (artefacts / "environment.json").is_file()
    monkeypatch.chdir(pytester.path / "tests")
    assert cli.main(["report"]) == 0
    assert (artefacts / "report.html").is_file() and not (pytester.path / "tests" / ".ditgate").exists()
    assert cli.main(["summary"]) == 0
    assert f"no experiments recorded under {artefacts}" in capsys.readouterr().out
    assert cli.main(["doctor", "--json"]) in (0, 1)
    workspaces = json.loads(capsys.readouterr().out)["workspaces"]
    assert workspaces["artefacts (--ditgate-dir / DITGATE_DIR)"] == str(artefacts)


def test_report_honours_ditgate_dir(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    _project(pytester.path)
    monkeypatch.setenv("DITGATE_DIR", "elsewhere")
    pytester.runpytest("--ditgate", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert (pytester.path / "elsewhere" / "environment.json").is_file()
    monkeypatch.chdir(pytester.path / "tests")
    assert cli.main(["report"]) == 0
    assert (pytester.path / "elsewhere" / "report.html").is_file()
    assert not (pytester.path / ".ditgate").exists() and not (pytester.path / "tests" / ".ditgate").exists()
    monkeypatch.setenv("DITGATE_DIR", "nowhere")
    assert cli.main(["report"]) == 4
    assert capsys.readouterr().err.startswith("ditgate report: error: DITGATE_DIR=nowhere: no such ledger folder ")


def test_doctor_with_an_unknown_target_exits_4_as_pytest_does(capsys) -> None:
    assert cli.main(["doctor", "--target", "a5501"]) == 4
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == ("ditgate doctor: error: --target a5501: unknown device profile 'a5501'; shipped "
                                    "profiles: a100, a5500, cpu, h100, h200, rtx4090 (or give a path to a JSON file)")


def test_version(capsys) -> None:
    with pytest.raises(SystemExit) as excinfo:
        cli.main(["--version"])
    assert excinfo.value.code == 0
    assert capsys.readouterr().out.strip() == f"ditgate (pytest-ditgate) {__version__}"


def test_report_names_the_lines_of_records_of_the_wrong_shape(tmp_path, capsys) -> None:
    lines = [{"kind": "measurement", "measurement": {"label": "ok", "median_ms": 1.0}},
             {"kind": "measurement", "measurement": "lost"},
             {"kind": "comparison", "test": "t", "ratio": "fast", "ci_low": 0.1, "ci_high": 0.2},
             {"kind": "comparison", "test": "t", "ratio": 0.5, "ci_low": 0.4, "ci_high": 0.6}]
    ledger = tmp_path / "bench.jsonl"
    ledger.write_text("".join(json.dumps(line) + "\n" for line in lines) + "not json\n")
    before = ledger.read_bytes()
    assert cli.main(["report", "--dir", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert f"{ledger}: skipped 1 unreadable line(s) (5)" in err
    assert f"{ledger}: left out 1 measurement record(s) without a 'measurement' object (line 2)" in err
    assert f"{ledger}: left out 1 comparison record(s) without a finite ratio, ci_low and ci_high (line 3)" in err
    assert ledger.read_bytes() == before  # read, never rewritten
    assert os.path.isfile(tmp_path / "report.html")


def test_a_fixture_using_cuda_under_a_gpu_profile_errors_in_one_line(pytester: pytest.Pytester, use_profile) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU host runs the fixture")
    use_profile("h200")
    pytester.makepyfile(test_fx="""
        import pytest, torch

        @pytest.fixture
        def weights():
            return torch.zeros(4, device="cuda")

        @pytest.mark.requires_gpu
        def test_uses(weights):
            pass
    """)
    result = pytester.runpytest("--ditgate", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["ditgate: DITGATE_DEVICE_PROFILE=h200 stands in for skip decisions only: it claims "
                                 "NVIDIA H200 (sm_90), but this machine has no CUDA GPU*"])
    assert "Traceback" not in result.stdout.str() and "torch/cuda" not in result.stdout.str()
