"""Symlinks in the golden store: a freeze writes only inside the store, by the rule a read applies (a key folder
linked outside is refused before anything is written, naming the link), and a read refusing a file that resolves
outside says so, naming the link, instead of "it must be <the same path>". A golden folder that is itself a link
(kept elsewhere, reached through one link) is a store like any other."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from pytest_ditgate.errors import GateFailure  # noqa: E402
from pytest_ditgate.golden.session import GoldenSession  # noqa: E402
from pytest_ditgate.golden.store import GoldenIntegrityError, GoldenStore  # noqa: E402

TEST = """
import torch

def test_g1(golden):
    golden.check("g1", {"out": torch.linspace(0.0, 1.0, 4096)})
"""


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest("--ditgate", "-p", "no:cacheprovider", "-rfE", *args)


def test_a_key_folder_linked_outside_is_refused_before_a_freeze_writes(pytester: pytest.Pytester,
                                                                       tmp_path_factory: pytest.TempPathFactory) -> None:
    """The freeze used to write through the link (outside the store), and every later check and freeze then
    refused the golden with "names file 'cpu/g1.safetensors'; it must be 'cpu/g1.safetensors'"."""
    outside = tmp_path_factory.mktemp("outside_cpu")
    (pytester.path / "golden").mkdir()
    (pytester.path / "golden" / "cpu").symlink_to(outside)
    pytester.makepyfile(test_g=TEST)
    result = run(pytester, "--ditgate-freeze")
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    result.stdout.fnmatch_lines([f"E * [[]golden_integrity[]] golden 'g1' for cpu was not frozen: *g1.safetensors "
                                 f"resolves outside * through the symlink {pytester.path / 'golden' / 'cpu'} -> "
                                 f"{outside}, and goldens are written only inside the store*replace the link*"])
    assert "it must be" not in text
    assert list(outside.iterdir()) == [] and not (pytester.path / "golden" / "manifest.json").exists()
    result = run(pytester)  # nothing was frozen: the check says so, and how to freeze
    result.assert_outcomes(failed=1)
    assert "[golden_missing] no golden 'g1'" in result.stdout.str()


def test_a_key_folder_linked_inside_the_store_is_written_and_read(pytester: pytest.Pytester) -> None:
    """The rule is where the file resolves: a key folder linked to another folder of the store stays inside."""
    (pytester.path / "golden" / "shared_cpu").mkdir(parents=True)
    (pytester.path / "golden" / "cpu").symlink_to(pytester.path / "golden" / "shared_cpu")
    pytester.makepyfile(test_g=TEST)
    run(pytester, "--ditgate-freeze").assert_outcomes(passed=1)
    assert (pytester.path / "golden" / "shared_cpu" / "g1.safetensors").is_file()
    run(pytester).assert_outcomes(passed=1)


def test_a_golden_folder_reached_through_a_link_is_an_ordinary_store(pytester: pytest.Pytester,
                                                                    tmp_path_factory: pytest.TempPathFactory) -> None:
    """Honest: the whole store kept elsewhere (a shared disk) and linked as golden/; freeze, check, refreeze and
    a mismatch all behave as in a plain folder."""
    elsewhere = tmp_path_factory.mktemp("goldens_elsewhere")
    (pytester.path / "golden").symlink_to(elsewhere)
    pytester.makepyfile(test_g=TEST)
    run(pytester, "--ditgate-freeze").assert_outcomes(passed=1)
    assert (elsewhere / "cpu" / "g1.safetensors").is_file()
    assert list(json.loads((elsewhere / "manifest.json").read_text())["entries"]) == ["cpu/g1"]
    run(pytester).assert_outcomes(passed=1)
    run(pytester, "--ditgate-refreeze").assert_outcomes(passed=1)
    run(pytester, f"--ditgate-golden-dir={elsewhere}").assert_outcomes(passed=1)
    pytester.makepyfile(test_g=TEST.replace("1.0, 4096", "1.5, 4096"))
    result = run(pytester)
    result.assert_outcomes(failed=1)
    assert "[golden_mismatch] golden 'g1' for cpu does not match" in result.stdout.str()


def test_a_plain_freeze_and_check_pass(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_g=TEST)
    run(pytester, "--ditgate-freeze").assert_outcomes(passed=1)
    assert (pytester.path / "golden" / "cpu" / "g1.safetensors").is_file()
    run(pytester).assert_outcomes(passed=1)


def test_a_golden_file_linked_to_an_identical_copy_outside_is_refused_naming_the_link(tmp_path: Path) -> None:
    """The read used to say "names file 'cpu/ga.safetensors'; it must be 'cpu/ga.safetensors'"."""
    root = tmp_path / "golden"
    freeze = GoldenSession(GoldenStore(root), mode="freeze")
    freeze.check("ga", {"x": torch.arange(4096.0)}, "cpu")
    freeze.finish()
    golden_file = root / "cpu" / "ga.safetensors"
    copy = tmp_path / "copy.safetensors"
    copy.write_bytes(golden_file.read_bytes())  # the very bytes the manifest lists
    golden_file.unlink()
    golden_file.symlink_to(copy)
    check = GoldenSession(GoldenStore(root), mode="check")
    with pytest.raises(GateFailure) as caught:
        check.check("ga", {"x": torch.arange(4096.0)}, "cpu")
    message = str(caught.value)
    assert message.startswith(f"[golden_integrity] golden 'cpu/ga': its file {golden_file} resolves outside {root} "
                              f"through the symlink {golden_file} -> {copy}; replace the link"), message
    assert "it must be" not in message


def test_a_link_made_after_the_check_queued_is_refused_by_the_flush(tmp_path: Path) -> None:
    """The flush applies the rule again before it writes anything (journal, file or manifest)."""
    root, outside = tmp_path / "golden", tmp_path / "outside"
    outside.mkdir()
    session = GoldenSession(GoldenStore(root), mode="freeze")
    session.check("late", {"x": torch.ones(8)}, "cpu")
    root.mkdir()
    (root / "cpu").symlink_to(outside)
    session.finish()
    assert session.written == [] and list(outside.iterdir()) == []
    assert len(session.write_errors) == 1 and "resolves outside" in session.write_errors[0], session.write_errors
    assert "through the symlink" in session.write_errors[0] and not (root / "manifest.json").exists()
    with pytest.raises(GoldenIntegrityError, match="through the symlink .* not written"):
        GoldenStore(root).write("cpu/late.safetensors", b"x")
    assert list(outside.iterdir()) == []
