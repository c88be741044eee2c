"""The golden store through pytest: freeze/refreeze rules, integrity checks, fallback chain, orphans."""

from __future__ import annotations

import json
import textwrap

import pytest

pytest.importorskip("torch")
pytest.importorskip("safetensors")

TESTS = """
import torch

def values(seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return {{"x": torch.randn(4, 8, generator=g) * scale, "y": torch.arange(6, dtype=torch.float32)}}

def test_a(golden):
    golden.check("a", values(0, {scale_a}))

def test_b(golden):
    golden.check("b", values(1))
"""


def write_tests(pytester: pytest.Pytester, scale_a: float = 1.0, body: str = TESTS) -> None:
    pytester.makepyfile(test_gold=body.format(scale_a=scale_a))


def manifest(pytester: pytest.Pytester) -> dict:
    return json.loads((pytester.path / "golden" / "manifest.json").read_text())


def test_normal_run_never_writes_and_names_the_freeze_flag(pytester: pytest.Pytester) -> None:
    write_tests(pytester)
    result = pytester.runpytest("--ditgate")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*?golden_missing? no golden 'a' for cpu (tried cpu) in *manifest.json; "
                                 "run pytest --ditgate --ditgate-freeze to create it"])
    assert not (pytester.path / "golden").exists()


def test_freeze_writes_only_missing_goldens(pytester: pytest.Pytester) -> None:
    write_tests(pytester, body=TESTS.split("def test_b")[0])
    pytester.runpytest("--ditgate", "--ditgate-freeze").assert_outcomes(passed=1)
    entry = manifest(pytester)["entries"]["cpu/a"]
    assert entry["file"] == "cpu/a.safetensors" and entry["key"] == "cpu"
    assert entry["tensors"] == {"x": {"shape": [4, 8], "dtype": "float32"}, "y": {"shape": [6], "dtype": "float32"}}
    assert entry["provenance"]["test"] == "test_gold.py::test_a"
    assert entry["provenance"]["torch"] and "--ditgate-freeze" in entry["provenance"]["command"]
    before = (pytester.path / "golden" / "cpu" / "a.safetensors").read_bytes()

    write_tests(pytester, scale_a=2.0)  # a now differs, b is new
    result = pytester.runpytest("--ditgate", "--ditgate-freeze")
    result.assert_outcomes(passed=1, failed=1)  # a is compared (and fails), never overwritten; b is written
    result.stdout.fnmatch_lines(["*?golden_mismatch? golden 'a' for cpu does not match:*", "*wrote 1 new golden(s): cpu/b*"])
    assert (pytester.path / "golden" / "cpu" / "a.safetensors").read_bytes() == before
    assert set(manifest(pytester)["entries"]) == {"cpu/a", "cpu/b"}


def test_refreeze_overwrites_loudly(pytester: pytest.Pytester) -> None:
    write_tests(pytester)
    pytester.runpytest("--ditgate", "--ditgate-freeze").assert_outcomes(passed=2)
    write_tests(pytester, scale_a=2.0)
    pytester.runpytest("--ditgate").assert_outcomes(passed=1, failed=1)
    result = pytester.runpytest("--ditgate", "--ditgate-refreeze")
    result.assert_outcomes(passed=2, warnings=1)
    result.stdout.fnmatch_lines(["*--ditgate-refreeze will OVERWRITE existing goldens*",
                                 "*REFREEZE: OVERWROTE 2 existing golden(s): cpu/a, cpu/b*"])
    pytester.runpytest("--ditgate").assert_outcomes(passed=2)


def test_mismatch_report_names_tensor_errors_and_limits(pytester: pytest.Pytester) -> None:
    write_tests(pytester)
    pytester.runpytest("--ditgate", "--ditgate-freeze").assert_outcomes(passed=2)
    write_tests(pytester, scale_a=1.001)  # x is 1e-3 off: beyond float32's rel-L2 limit 1e-4
    result = pytester.runpytest("--ditgate")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*FAIL x: rel_l2 1.000e-03 (limit 1.0e-04), rel_max 1.000e-03 (limit 1.0e-03)*",
                                 "*ok   y: rel_l2 0.000e+00*"])


def test_zeros_and_missing_tensors_fail(pytester: pytest.Pytester) -> None:
    write_tests(pytester)
    pytester.runpytest("--ditgate", "--ditgate-freeze").assert_outcomes(passed=2)
    pytester.makepyfile(test_gold="""
        import torch
        def test_a(golden):
            golden.check("a", {"x": torch.zeros(4, 8), "y": torch.arange(6, dtype=torch.float32)})
        def test_b(golden):
            golden.check("b", {"x": torch.zeros(4, 8)})
    """)
    result = pytester.runpytest("--ditgate")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*FAIL x: rel_l2 1.000e+00*", "*FAIL y: missing from the candidate*"])


@pytest.mark.parametrize("damage, message", [
    ("flip", "*?golden_integrity? golden file *a.safetensors was modified: sha256 *manifest says *"),
    ("truncate", "*?golden_integrity? golden file *a.safetensors is truncated: * bytes, manifest says *"),
    ("delete", "*golden file *a.safetensors is listed in *manifest.json but missing*"),
    ("manifest", "*?golden_integrity? *manifest.json: golden manifest is not valid JSON*"),
])
def test_damaged_goldens_fail_naming_the_file(pytester: pytest.Pytester, damage: str, message: str) -> None:
    write_tests(pytester)
    pytester.runpytest("--ditgate", "--ditgate-freeze").assert_outcomes(passed=2)
    path = pytester.path / "golden" / "cpu" / "a.safetensors"
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-3] ^= 0x01
        path.write_bytes(bytes(data))
    elif damage == "truncate":
        path.write_bytes(bytes(data[:-10]))
    elif damage == "delete":
        path.unlink()
    else:
        (pytester.path / "golden" / "manifest.json").write_text("{ not json")
    result = pytester.runpytest("--ditgate")
    result.stdout.fnmatch_lines([message])
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_fallback_chain_is_reported(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_gold="""
        import torch
        T = {"x": torch.linspace(-1, 1, 32)}
        def test_freeze_sm86(golden):
            golden.check("f", T, device="sm_86")
        def test_freeze_cpu(golden):
            golden.check("g", T, device="cpu")
    """)
    pytester.runpytest("--ditgate", "--ditgate-freeze").assert_outcomes(passed=2)
    pytester.makepyfile(test_gold="""
        import torch
        T = {"x": torch.linspace(-1, 1, 32)}
        def test_freeze_sm86(golden):
            result = golden.check("f", {"x": T["x"] * 1.00015}, device="sm_89")
            assert (result.key_used, result.fallback, result.tolerance_scale) == ("sm_86", True, 2.0)
        def test_freeze_cpu(golden):
            hit = golden.load("g", device="sm_90")
            assert (hit.key_used, hit.fallback, hit.tolerance_scale, hit.step.rule) == ("cpu", True, 4.0, "cpu")
            assert "via fallback cpu" in hit.describe()
    """)
    result = pytester.runpytest("--ditgate")
    result.assert_outcomes(passed=2)  # 1.5e-4 error passes only thanks to the family scale
    result.stdout.fnmatch_lines(["*fallback: test_gold.py::test_freeze_sm86 used golden 'f' of sm_86 (no sm_89 golden)*",
                                 "*fallback: test_gold.py::test_freeze_cpu used golden 'g' of cpu (no sm_90 golden)*"])


def test_orphans_are_listed_only_when_their_test_ran_or_is_gone(pytester: pytest.Pytester) -> None:
    write_tests(pytester)
    pytester.runpytest("--ditgate", "--ditgate-freeze").assert_outcomes(passed=2)
    pytester.runpytest("--ditgate", "-k", "test_a").stdout.no_fnmatch_line("*orphaned*")
    (pytester.path / "golden" / "cpu" / "stray.safetensors").write_bytes(b"x")
    write_tests(pytester, body=TESTS.split("def test_b")[0])  # test_b removed: its golden is an orphan
    result = pytester.runpytest("--ditgate")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*1 orphaned golden(s), used by no test: cpu/b*",
                                 "*1 golden file(s) not in the manifest: cpu/stray.safetensors*"])


def test_custom_comparator_hook(pytester: pytest.Pytester) -> None:
    write_tests(pytester)
    pytester.runpytest("--ditgate", "--ditgate-freeze").assert_outcomes(passed=2)
    pytester.makepyfile(test_gold="""
        import types, torch
        def strict(candidate, hit):
            return types.SimpleNamespace(passed=False, lines=lambda: [f"strict rejects {hit.name} ({hit.key_used})"])
        def test_a(golden):
            golden.check("a", {"x": torch.zeros(1)}, compare=strict)
    """)
    result = pytester.runpytest("--ditgate")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*strict rejects a (cpu)*"])


def test_tensor_names_are_checked_for_every_comparator(pytester: pytest.Pytester) -> None:
    """A comparator that accepts anything still cannot pass a candidate that lacks a golden tensor or
    brings one the golden does not have: the names are the golden store's rule, not the comparator's."""
    write_tests(pytester)
    pytester.runpytest("--ditgate", "--ditgate-freeze").assert_outcomes(passed=2)
    pytester.makepyfile(test_gold="""
        import types, torch
        seen = []
        def lenient(candidate, hit):
            seen.append((sorted(candidate), sorted(hit.tensors)))
            return types.SimpleNamespace(passed=True, lines=lambda: [])
        def test_missing(golden):
            golden.check("a", {"x": torch.zeros(4, 8)}, compare=lenient)
        def test_extra(golden):
            golden.check("b", {"x": torch.zeros(4, 8), "y": torch.zeros(6), "z": torch.zeros(2)}, compare=lenient)
        def test_same_names(golden):
            golden.check("b", {"x": torch.zeros(4, 8), "y": torch.zeros(6)}, compare=lenient)
            assert seen[-1] == (["x", "y"], ["x", "y"])
    """)
    result = pytester.runpytest("--ditgate", "-p", "no:randomly")
    result.assert_outcomes(failed=2, passed=1)
    result.stdout.fnmatch_lines(["*golden 'a' for cpu does not match:*", "*FAIL y: missing from the candidate*"])
    result.stdout.fnmatch_lines(["*golden 'b' for cpu does not match:*", "*FAIL z: not in the golden (refreeze to add it)*"])


def test_optional_tensors_may_be_absent_and_are_reported_required_ones_may_not(pytester: pytest.Pytester) -> None:
    """Diagnostics a candidate cannot produce (block activations under a CUDA graph) are optional: judged on
    the rest, named in the summary; a missing required tensor, an extra tensor or a mismatch still fail."""
    pytester.makepyfile(test_gold="""
        import torch
        def tensors(scale=1.0):
            g = torch.Generator().manual_seed(0)
            return {"latents": torch.randn(4, 8, generator=g) * scale, "images": torch.rand(2, 3, 4, 4, generator=g),
                    "block0.step0": torch.randn(16, generator=g), "block1.step0": torch.randn(16, generator=g)}
        def test_freeze(golden):
            golden.check("case", tensors())
    """)
    pytester.runpytest("--ditgate", "--ditgate-freeze").assert_outcomes(passed=1)
    pytester.makepyfile(test_gold="""
        import torch
        def tensors(scale=1.0):
            g = torch.Generator().manual_seed(0)
            return {"latents": torch.randn(4, 8, generator=g) * scale, "images": torch.rand(2, 3, 4, 4, generator=g),
                    "block0.step0": torch.randn(16, generator=g), "block1.step0": torch.randn(16, generator=g)}
        def required(scale=1.0):
            return {k: v for k, v in tensors(scale).items() if not k.startswith("block")}
        def test_without_diagnostics(golden):
            result = golden.check("case", required(), optional=["block*"])
            assert result.status == "matched" and result.not_compared == ("block0.step0", "block1.step0")
        def test_with_diagnostics(golden):
            assert golden.check("case", tensors(), optional=["block*"]).not_compared == ()
        def test_missing_required(golden):
            golden.check("case", {"latents": tensors()["latents"]}, optional=["block*"])
        def test_wrong_required(golden):
            golden.check("case", required(1.5), optional=["block*"])
        def test_optional_is_not_a_wildcard_for_everything(golden):
            golden.check("case", {"other": torch.zeros(2)}, optional=["*"])
    """)
    result = pytester.runpytest("--ditgate", "-p", "no:randomly")
    result.assert_outcomes(passed=2, failed=3)
    result.stdout.fnmatch_lines(["*FAIL images: missing from the candidate (required)*"])
    result.stdout.fnmatch_lines(["*FAIL latents: rel_l2*", "*not compared (optional, not produced by the candidate): "
                                 "block0.step0, block1.step0*"])
    result.stdout.fnmatch_lines(["*FAIL other: not in the golden*", "*FAIL: no tensor in common with the golden*"])
    result.stdout.fnmatch_lines(["*check(s) judged on required tensors only: * optional golden tensor(s) not produced*",
                                 "*not compared: test_gold.py::test_without_diagnostics ?case?: block0.step0, block1.step0"])
    assert "not compared: test_gold.py::test_missing_required" not in result.stdout.str()


def test_the_summary_and_the_failure_name_optional_tensors_alike() -> None:
    """One helper shows the optional tensors not compared, in the run summary and in a failure message."""
    from pytest_ditgate.golden.report import GoldenReport, shown_names
    from pytest_ditgate.golden.session import _not_compared_line

    names = tuple(f"block{i}.step0" for i in range(6))
    tail = "block0.step0, block1.step0, block2.step0, block3.step0, ... (6 in all)"
    assert shown_names(names) == tail and shown_names(names[:2]) == "block0.step0, block1.step0"
    assert (f"  not compared: t.py::t [case]: {tail}", {}) in GoldenReport("check", not_compared=[
        ("t.py::t", "case", names)]).lines()
    assert _not_compared_line(names) == f"not compared (optional, not produced by the candidate): {tail}"


def test_machine_keys_are_frozen_per_machine_and_never_fall_back(pytester: pytest.Pytester) -> None:
    """Bitwise claims are judged against goldens of THIS machine only: the machine key has no fallback to
    the device kind's golden, its missing golden says how to make one, and freezing records the machine."""
    pytester.makepyfile(test_gold="""
        import torch
        def test_kind(golden):
            golden.check("case", {"x": torch.ones(4)}, device="cpu")
        def test_machine(golden):
            key = golden.machine_key("cpu")
            assert key.startswith("cpu.") and len(key) == 12 and key == golden.machine_key("cpu")
            golden.check("case", {"x": torch.ones(4)}, device=key)
    """)
    result = pytester.runpytest("--ditgate", "-p", "no:randomly", "-k", "kind", "--ditgate-freeze")
    result.assert_outcomes(passed=1)
    result = pytester.runpytest("--ditgate", "-p", "no:randomly", "-k", "machine")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*golden_missing* no golden 'case' for this machine (cpu.*)*bitwise claims are "
                                 "judged only against goldens frozen on this machine: run `ditgate baseline`*"])
    pytester.runpytest("--ditgate", "--ditgate-freeze", "-p", "no:randomly").assert_outcomes(passed=2)
    entries = manifest(pytester)["entries"]
    (machine,) = [e for k, e in entries.items() if k.startswith("cpu.")]
    assert "torch" in machine["provenance"]["metadata"]["machine"]
    pytester.runpytest("--ditgate", "-p", "no:randomly").assert_outcomes(passed=2)


@pytest.mark.parametrize("args, message", [
    (("--ditgate", "--ditgate-freeze", "--ditgate-refreeze"), "*--ditgate-freeze and --ditgate-refreeze exclude each other*"),
    (("--ditgate-freeze",), "*--ditgate-freeze needs --ditgate*"),
])
def test_contradictory_flags_are_usage_errors(pytester: pytest.Pytester, args, message) -> None:
    write_tests(pytester)
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_golden_dir_option_and_gates_off(pytester: pytest.Pytester) -> None:
    write_tests(pytester)
    pytester.runpytest("--ditgate", "--ditgate-freeze", "--ditgate-golden-dir", "store").assert_outcomes(passed=2)
    assert (pytester.path / "store" / "manifest.json").is_file()
    pytester.runpytest().assert_outcomes(skipped=2)


@pytest.mark.slow  # two xdist workers each import torch: ~20 s on two shared cores
def test_xdist_workers_merge_into_one_manifest(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    body = "\n".join(textwrap.dedent(f"""
        def test_{i}(golden):
            import torch
            golden.check("g{i}", {{"x": torch.full((3,), {i}.0)}})
    """) for i in range(6))
    pytester.makepyfile(test_many=body)
    result = pytester.runpytest("--ditgate", "--ditgate-freeze", "-n", "2", "-p", "xdist")
    result.assert_outcomes(passed=6)
    assert set(manifest(pytester)["entries"]) == {f"cpu/g{i}" for i in range(6)}  # no worker lost another's
