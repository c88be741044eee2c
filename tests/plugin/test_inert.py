"""Without --ditgate the plugin only registers markers and options, and costs no heavy import."""

from __future__ import annotations

import sys
import textwrap

import pytest

GATE_SUITE = """
import pytest

@pytest.mark.requires_gpu
def test_gpu():
    pass

@pytest.mark.ditgate
def test_gate():
    pass

def test_plain():
    pass
"""


def test_gate_tests_skip_with_how_to_enable(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(GATE_SUITE)
    result = pytester.runpytest("-rs")
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines(["*gates are off; run pytest with --ditgate*"])


@pytest.mark.parametrize("fixture", ["ditgate_device", "ditgate_artefacts"])
def test_core_fixture_makes_a_gate_test(pytester: pytest.Pytester, fixture: str) -> None:
    """A ditgate fixture exists only with the gates on: without them its test skips with the reason, no error."""
    pytester.makepyfile(f"def test_uses_it({fixture}):\n    assert {fixture}\n")
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*gates are off; run pytest with --ditgate*"])
    pytester.runpytest("--ditgate").assert_outcomes(passed=1)


def test_ini_option_turns_gates_on(pytester: pytest.Pytester, use_profile) -> None:
    use_profile("h200")
    pytester.makeini("[pytest]\nditgate = true\n")
    pytester.makepyfile(GATE_SUITE)
    pytester.runpytest().assert_outcomes(passed=3)


def test_markers_are_registered(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["*requires_gpu(cc=None*", "*ditgate: a gate test*"])


def test_options_in_one_group(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(["ditgate: GPU correctness, speed and quality gates:", "*--ditgate *", "*--ditgate-target*"])


def test_no_torch_import_when_collecting_a_torch_free_suite(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(GATE_SUITE)
    pytester.makeconftest(textwrap.dedent("""
        import sys
        def pytest_collection_finish(session):
            heavy = sorted(m for m in ("torch", "diffusers", "pynvml", "triton") if m in sys.modules)
            print("HEAVY=" + ",".join(heavy))
    """))
    result = pytester.runpytest_subprocess("--co", "-q", "-s")
    result.stdout.fnmatch_lines(["HEAVY="])
    assert result.ret == 0


def test_importing_the_plugin_imports_no_torch() -> None:
    import subprocess

    code = "import sys, pytest_ditgate.plugin, pytest_ditgate; print(sorted(m for m in ('torch','pynvml','diffusers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_gates_off_load_only_the_light_modules(pytester: pytest.Pytester) -> None:
    """Startup cost guard: with the gates off no concern's machinery is imported (only option declarations)."""
    pytester.makepyfile("import pytest\n@pytest.mark.ditgate\ndef test_gate():\n    pass\ndef test_plain():\n    pass\n")
    pytester.makeconftest(textwrap.dedent("""
        import sys
        def pytest_collection_finish(session):
            loaded = sorted(m for m in sys.modules if m.startswith("pytest_ditgate."))
            print("LOADED=" + ",".join(loaded))
    """))
    result = pytester.runpytest_subprocess("--co", "-q", "-s")
    line = next(l for l in result.stdout.lines if l.startswith("LOADED="))
    loaded = set(line[len("LOADED="):].split(","))
    heavy = {"pytest_ditgate.bench.runner", "pytest_ditgate.bench.plugin", "pytest_ditgate.golden.store",
             "pytest_ditgate.golden.golden_plugin", "pytest_ditgate.quality.quality_plugin",
             "pytest_ditgate.verdict.plugin", "pytest_ditgate.correctness.checks", "pytest_ditgate.device",
             "pytest_ditgate.requirements", "pytest_ditgate.environment"}
    assert not loaded & heavy, sorted(loaded & heavy)


def test_gates_on_load_no_phase_profiling_until_a_profile_is_taken(pytester: pytest.Pytester) -> None:
    """Startup cost guard with --ditgate: the phase table, trace summaries and traffic models load only with
    a profile to report (about 12 ms of regex and table set-up otherwise paid by every gated run)."""
    pytester.makepyfile("def test_plain():\n    pass\n")
    pytester.makeconftest(textwrap.dedent("""
        import sys
        def pytest_collection_finish(session):
            loaded = sorted(m for m in sys.modules if m.startswith("pytest_ditgate."))
            print("LOADED=" + ",".join(loaded))
    """))
    result = pytester.runpytest_subprocess("--ditgate", "--co", "-q", "-s", "-p", "no:cacheprovider")
    line = next(l for l in result.stdout.lines if l.startswith("LOADED="))
    loaded = set(line[len("LOADED="):].split(","))
    assert "pytest_ditgate.bench.plugin" in loaded  # the gates are on
    profiling = {"pytest_ditgate.bench.profiling", "pytest_ditgate.bench.phases", "pytest_ditgate.bench.traffic",
                 "pytest_ditgate.bench.tracing"}
    assert not loaded & profiling, sorted(loaded & profiling)
