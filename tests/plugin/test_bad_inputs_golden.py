"""Golden store inputs: names, keys and manifests are validated; freeze never replaces a file it did not
write in that run (an untracked file, a golden another run froze meanwhile); killed writes leave no temp
files behind; a gate failure reads as the test and the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from pytest_ditgate.errors import DitgateUsageError, GateFailure  # noqa: E402
from pytest_ditgate.golden.keys import validate_key  # noqa: E402
from pytest_ditgate.golden.manifest import Manifest, ManifestError  # noqa: E402
from pytest_ditgate.golden.session import GoldenSession  # noqa: E402
from pytest_ditgate.golden.store import GoldenStore, validate_name  # noqa: E402


@pytest.mark.parametrize("name", ["img\n", "a/b", "..", "a..b", ".hidden", "", "x" * 201, 3])
def test_bad_golden_names(name) -> None:
    with pytest.raises(DitgateUsageError, match="bad golden name .*use letters, digits"):
        validate_name(name)


@pytest.mark.parametrize("key", ["sm_86\n", "cuda", "sm_8", ""])
def test_bad_device_keys(key: str) -> None:
    with pytest.raises(ValueError, match="bad golden device key"):
        validate_key(key)


def _entry(**changes) -> dict:
    entry = {"name": "a", "key": "cpu", "file": "cpu/a.safetensors", "sha256": "0" * 64, "size": 1, "tensors": {}}
    entry.update(changes)
    return entry


@pytest.mark.parametrize(("changes", "message"), [
    ({"file": "../outside.safetensors"}, "must be a relative path inside the golden folder"),
    ({"file": "/etc/passwd"}, "must be a relative path inside the golden folder"),
    ({"size": -1}, "size must be an integer >= 0"),
    ({"size": "12"}, "size must be an integer >= 0"),
    ({"sha256": "abc"}, "sha256 must be 64 lowercase hex digits"),
    ({"tensors": []}, "tensors and provenance must be objects"),
    ({"name": "b"}, "its key and name say 'cpu/b'"),
])
def test_bad_manifest_entries_name_the_file(tmp_path: Path, changes: dict, message: str) -> None:
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"version": 1, "entries": {"cpu/a": _entry(**changes)}}))
    with pytest.raises(ManifestError, match=str(path).replace(".", r"\.") + ".*" + message.replace("(", r"\(")):
        Manifest.load(path)


def test_a_manifest_file_field_never_leads_outside(tmp_path: Path) -> None:
    store = GoldenStore(tmp_path / "golden")
    (tmp_path / "golden" / "cpu").mkdir(parents=True)
    (tmp_path / "secret.safetensors").write_bytes(b"x")
    (tmp_path / "golden" / "cpu" / "a.safetensors").symlink_to(tmp_path / "secret.safetensors")
    entry = Manifest.load(_write_manifest(store, _entry())).entries["cpu/a"]
    with pytest.raises(GateFailure, match=r"\[golden_integrity\] golden 'cpu/a': its file .*a.safetensors resolves outside "
                                          ".* through the symlink"):
        store.read(entry)
    other = Manifest.load(_write_manifest(store, _entry(file="cpu/b.safetensors"))).entries["cpu/a"]
    with pytest.raises(GateFailure, match="names file 'cpu/b.safetensors'; it must be 'cpu/a.safetensors'"):
        store.read(other)


def _write_manifest(store: GoldenStore, entry: dict) -> Path:
    store.manifest_path.parent.mkdir(parents=True, exist_ok=True)
    store.manifest_path.write_text(json.dumps({"version": 1, "entries": {f"{entry['key']}/{entry['name']}": entry}}))
    return store.manifest_path


def _session(root: Path) -> GoldenSession:
    return GoldenSession(GoldenStore(root), mode="freeze")


def test_freeze_never_replaces_an_untracked_file(tmp_path: Path) -> None:
    session = _session(tmp_path)
    (tmp_path / "cpu").mkdir()
    theirs = tmp_path / "cpu" / "a.safetensors"
    theirs.write_bytes(b"someone's work")
    with pytest.raises(GateFailure, match=r"\[golden_untracked\] golden file .*a.safetensors exists but .*manifest.json "
                                          "does not list it; --ditgate-freeze never replaces a file it did not write"):
        session.check("a", {"x": torch.ones(3)}, "cpu")
    session.finish()
    assert theirs.read_bytes() == b"someone's work" and not session.store.manifest_path.exists()


def test_concurrent_freezes_write_once(tmp_path: Path) -> None:
    first, second, third = _session(tmp_path), _session(tmp_path), _session(tmp_path)
    for session, value in ((first, 1.0), (second, 2.0), (third, 1.0)):
        assert session.check("a", {"x": torch.full((3,), value)}, "cpu").status == "written"  # all queued
    first.finish()
    written = (tmp_path / "cpu" / "a.safetensors").read_bytes()
    second.finish()
    third.finish()
    assert first.written == ["cpu/a"] and second.written == [] and third.written == []
    assert third.write_errors == []  # the same bytes: nothing to report
    assert len(second.write_errors) == 1 and "golden 'cpu/a' was frozen by another run" in second.write_errors[0]
    assert (tmp_path / "cpu" / "a.safetensors").read_bytes() == written


def test_freeze_removes_temp_files_of_killed_writes(tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()
    stale = [tmp_path / ".manifest.json.ab12.tmp", tmp_path / "cpu" / ".a.safetensors.cd34.tmp"]
    for path in stale:
        path.write_bytes(b"half")
    session = _session(tmp_path)
    session.check("b", {"x": torch.ones(2)}, "cpu")
    session.finish()
    assert not any(path.exists() for path in stale) and session.written == ["cpu/b"]


def test_kernel_check_failure_is_short_and_reason_first(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_k="""
        import torch
        def make(seed):
            return (torch.randn(4, 4, generator=torch.Generator().manual_seed(seed)),)
        def test_k(kernel_check):
            kernel_check(lambda x: x * 2 + 1, lambda x: x * 2, make, trials=1)
    """)
    result = pytester.runpytest("--ditgate", "-p", "no:cacheprovider", "-rf")
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert "checks.py" not in text and "correctness/plugin.py:" not in text  # no plugin internals
    result.stdout.fnmatch_lines(["E   *GateFailure: [[]mismatch[]] kernel_check * failed: mismatch*",
                                 "FAILED test_k.py::test_k - [[]mismatch[]] kernel_check*"])


def test_gate_failures_are_trimmed_by_the_main_plugin(pytester: pytest.Pytester) -> None:
    """The trimming serves every gate: it stays with the kernel_check plugin blocked (pytest -p no:)."""
    pytester.makepyfile(test_k="""
        import torch
        from pytest_ditgate import check_kernel
        def make(seed):
            return (torch.randn(4, 4, generator=torch.Generator().manual_seed(seed)),)
        def test_k():
            check_kernel(lambda x: x * 2 + 1, lambda x: x * 2, make, trials=1)
    """)
    result = pytester.runpytest("--ditgate", "-p", "no:cacheprovider", "-p", "no:pytest_ditgate.correctness.plugin",
                                "-rf")
    result.assert_outcomes(failed=1)
    assert "checks.py" not in result.stdout.str()
    result.stdout.fnmatch_lines(["FAILED test_k.py::test_k - [[]mismatch[]] kernel_check*"])
