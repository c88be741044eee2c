"""Bad requires_gpu markers and bad device profiles: exit 4 before any test runs, naming the source and
the allowed values; never INTERNALERROR, never a silent pass or a skip everywhere."""

from __future__ import annotations

import pytest

from pytest_ditgate import cli


@pytest.mark.parametrize(("marker", "message"), [
    ("min_memory_gb=float('nan')", "*min_memory_gb=...) takes a finite positive number of GB, got nan*"),
    ("min_memory_gb=float('inf')", "*min_memory_gb=...) takes a finite positive number of GB, got inf*"),
    ("sdpa=[]", "*sdpa=...) takes a backend name or a non-empty list of them (flash, efficient, cudnn, math), got []*"),
    ("sdpa=[1]", "*sdpa=...): unknown backend 1; known: flash, efficient, cudnn, math*"),
    ("cc='>=8.0,<=7.0'", "*cc=...): '>=8.0,<=7.0' can never hold*"),
    ("cc='9.0-8.0'", "*cc=...): '9.0-8.0' can never hold*"),
    ("cc='>8.9,<9.0'", "*cc=...): '>8.9,<9.0' can never hold*"),
    ("cc=['sm_86', '<7.0,>8.0']", "*(alternative '<7.0,>8.0') can never hold*"),
    ("triton=1", "*triton=...) takes True, False or a version spec string like '>=12.4' (or a list of them), got 1*"),
    ("nvcc=12.4", "*nvcc=...) takes True, False or a version spec string*got 12.4*"),
    ("nvcc='>=12.4,<12.0'", "*nvcc=...): '>=12.4,<12.0' can never hold*"),
    ("why=3", "*why=...) takes a non-empty string, got 3*"),
    ("bf16='yes'", "*bf16=...) takes True or False, got 'yes'*"),
])
def test_bad_requirement_is_a_usage_error(pytester: pytest.Pytester, marker: str, message: str) -> None:
    pytester.makepyfile(f"""
        import pytest
        @pytest.mark.requires_gpu({marker})
        def test_gpu(): pass
    """)
    result = pytester.runpytest("--ditgate", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: bad requires_gpu marker(s):", "*test_bad_requirement*::test_gpu: " + message])
    assert "INTERNALERROR" not in result.stderr.str() + result.stdout.str()


def test_cpu_skip_reason_names_the_requirement(pytester: pytest.Pytester, use_profile) -> None:
    use_profile("cpu")
    pytester.makepyfile("""
        import pytest
        @pytest.mark.requires_gpu(cc=">=8.0", min_memory_gb=20, why="fp8 gemm")
        def test_gpu(): pass
    """)
    result = pytester.runpytest("--ditgate", "-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*needs a CUDA GPU with sm>=8.0, 20 GB of device memory for fp8 gemm; device is cpu*"])


PROFILES = [
    ("unknown", None, "*unknown device profile 'doesnotexist'; shipped profiles: a100, a5500, cpu*"),
    ("missing field", '{"arch": "sm_86"}', "*missing field(s) name (required: name, arch)*"),
    ("bf16 as text", '{"name": "x", "arch": "sm_86", "bf16": "no"}', "*field 'bf16' must be true or false, got 'no'*"),
    ("cc as text", '{"name": "x", "arch": "sm_86", "cc": "nine"}', "*field 'cc' must be [[]major, minor[]] integers*got 'nine'*"),
    ("cc vs arch", '{"name": "x", "arch": "sm_86", "cc": [9, 0]}', "*cc [[]9, 0[]] does not match arch 'sm_86'*"),
    ("bad arch", '{"name": "x", "arch": "ampere"}', "*arch must be 'cpu' or like 'sm_86', got 'ampere'*"),
    ("unknown field", '{"name": "x", "arch": "sm_86", "memory": 24}', "*unknown field(s) memory; allowed: name, arch*"),
    ("sdpa backend", '{"name": "x", "arch": "sm_86", "sdpa": {"flashy": true}}', "*sdpa.flashy = True: backends are flash, efficient, cudnn, math*"),
    ("negative memory", '{"name": "x", "arch": "sm_86", "total_memory_bytes": -1}', "*'total_memory_bytes' must be a positive integer or null*"),
    ("not an object", "[]", "*must hold a JSON object, found list*"),
    ("not json", "{name", "*not valid JSON*"),
    ("not utf-8", b"\xff\xfe{}", "*not UTF-8 text*"),
]


@pytest.mark.parametrize(("case", "content", "message"), PROFILES, ids=[p[0] for p in PROFILES])
def test_bad_profile_is_a_usage_error_before_any_test(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                      case: str, content, message: str) -> None:
    if content is None:
        spec = "doesnotexist"
    else:
        path = pytester.path / "p.json"
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        spec = str(path)
    monkeypatch.setenv("DITGATE_DEVICE_PROFILE", spec)
    pytester.makepyfile("def test_never_runs(): raise SystemExit('ran')")
    result = pytester.runpytest("--ditgate", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: DITGATE_DEVICE_PROFILE=*: {message}"])
    assert "INTERNALERROR" not in result.stderr.str()


def test_doctor_under_a_bad_profile_reports_it(monkeypatch: pytest.MonkeyPatch, tmp_path, capsys) -> None:
    (tmp_path / "p.json").write_text('{"name": "x", "arch": "sm_86", "bf16": "no"}')
    monkeypatch.setenv("DITGATE_DEVICE_PROFILE", str(tmp_path / "p.json"))
    assert cli.main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "field 'bf16' must be true or false, got 'no'; showing the real device instead" in out
    assert "status: NOT READY" in out


@pytest.mark.parametrize("argv", [["doctor", "--bogus"], ["nosuchcommand"], ["summary", "-n", "x"]])
def test_cli_bad_arguments_exit_4(argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 4
    assert "error:" in capsys.readouterr().err
