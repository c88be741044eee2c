"""scripts/agent_loop_classes.py (the GPU check's classes stage) without running it: every class has an honest
and a harmful candidate whose expectations fit the issue's table on both devices, and every edit still applies
to the tree as it is (a renamed option would otherwise surface only on the GPU)."""

from __future__ import annotations

import importlib.util
import io
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "agent_loop_classes.py"


@pytest.fixture(scope="module")
def classes():
    sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("agent_loop_classes", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["agent_loop_classes"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_each_class_has_an_honest_and_a_harmful_candidate(classes) -> None:
    chosen = classes.candidates(0.5, 2)
    by_class: dict[str, list[str]] = {}
    for candidate in chosen:
        kind = "kernels" if candidate.lane == "kernels" else candidate.judged
        by_class.setdefault(kind, []).append(candidate.name)
        harmful = "harmful" in candidate.name
        for device, allowed in candidate.expected.items():
            assert allowed and set(allowed) <= {0, 10, 11}, (candidate.name, device)  # never 12, 14, 15
            assert not (harmful and 0 in allowed), candidate.name
        assert "gpu" in candidate.expected and (candidate.gpu_only or "cpu" in candidate.expected)
    assert set(by_class) == {"numerical", "approximate", "quantization", "kernels"}
    for kind, names in by_class.items():
        assert any("harmful" in n for n in names) and any("harmful" not in n for n in names), kind
    # the harmful approximate and quantization candidates claim numerical: their class is found by what runs
    assert {c.judged for c in chosen if c.claims == "numerical" and c.judged != "numerical"} == {
        "approximate", "quantization"}


def test_every_edit_applies_to_the_tree(classes, tmp_path: Path) -> None:
    for path in ("pyproject.toml", classes.CANDIDATE, classes.ATTENTION, classes.KERNEL_LANE):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tmp_path / path)
    pristine = {p: (tmp_path / p).read_text() for p in (classes.CANDIDATE, classes.ATTENTION, classes.KERNEL_LANE)}
    loop = classes.Loop(tmp_path, io.StringIO())
    for candidate in classes.candidates(0.5, 2):
        for edit in [edit for _, edit, _ in candidate.before] + candidate.edits:
            edit(loop)
        changed = [p for p, text in pristine.items() if (tmp_path / p).read_text() != text]
        assert changed or not candidate.edits, candidate.name
        if (tmp_path / classes.CANDIDATE).read_text() != pristine[classes.CANDIDATE]:
            namespace: dict = {}
            exec(compile((tmp_path / classes.CANDIDATE).read_text(), classes.CANDIDATE, "exec"), namespace)
            assert namespace["options_for"]("cpu").dtype == "float32", candidate.name  # still a valid module
        for path, text in pristine.items():
            (tmp_path / path).write_text(text)


def test_a_lane_shard_judges_only_its_lane(classes) -> None:
    """The GPU check runs the stage as a unit per lane (``--lane``): each shard has its lane's candidates only,
    the harmful ones among them; a CPU has no kernel lane."""
    found = classes.candidates(0.5, 2)
    dit = classes.select(found, True, None, "dit")
    kernels = classes.select(found, True, None, "kernels")
    assert dit and kernels and {c.lane for c in dit} == {"dit"} and {c.lane for c in kernels} == {"kernels"}
    assert len(dit) + len(kernels) == len(classes.select(found, True, None, None)) == len(found)
    assert any("harmful" in c.name for c in kernels) and any("harmful" in c.name for c in dit)
    assert classes.select(found, False, None, "kernels") == []
