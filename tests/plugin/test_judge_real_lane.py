"""The project's own DiT lane through the judge on the CPU: the shapes case is re-judged out of process
with the kinds and labels its test judged it with (pixel-space latents, the learned metrics)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from judge_project import PLUGIN_SRC, clean_env

pytest.importorskip("diffusers")
ROOT = Path(__file__).resolve().parents[2]
SKIP = shutil.ignore_patterns(".git", ".venv", ".whl", ".gl", ".stage", ".ditgate", "__pycache__", "*.pyc",
                              ".pytest_cache", ".hypothesis", ".tox", ".import_linter_cache", "build", "dist",
                              "*.egg-info", "benchmarks", "docs", ".ci")


def _env() -> dict[str, str]:
    """The judge's environment, keeping packages a GPU machine installs into a folder on PYTHONPATH (diffusers
    there): entries outside the project, which the judge accepts as long as they shadow none of its modules."""
    inherited = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                 if entry and not Path(entry).resolve().is_relative_to(ROOT.resolve())]
    return clean_env(PYTHONPATH=os.pathsep.join([PLUGIN_SRC, *inherited]))


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=600, env=_env())


@pytest.mark.slow
@pytest.mark.gpu_check  # two judged runs of the DiT lane, 50 s of CPU; its DISCARD (11) is a host-clock verdict
def test_real_dit_lane_judges_the_shapes_case_on_the_learned_metrics(tmp_path: Path) -> None:
    project = tmp_path / "project"
    # the working tree as it is (the GPU check's machine has a copy of it, without .git), less what is
    # generated or never part of a lane's judged run
    shutil.copytree(ROOT, project, ignore=SKIP)
    for args in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "project"]):
        subprocess.run(args, cwd=project, check=True, env=clean_env())
    baseline = _run([sys.executable, "-m", "pytest_ditgate", "baseline", "--lane", "dit"], project)
    assert baseline.returncode == 0, baseline.stdout[-3000:] + baseline.stderr[-3000:]
    subprocess.run(["git", "commit", "-q", "--allow-empty", "-m", "empty"], cwd=project, check=True, env=clean_env())
    experiment = _run([sys.executable, "-m", "pytest_ditgate", "experiment", "--lane", "dit", "--class", "numerical",
                       "--description", "empty commit"], project)
    assert experiment.returncode == 11, experiment.stdout[-3000:] + experiment.stderr[-3000:]  # no speedup
    assert "the judge timed the lane" in experiment.stdout  # its own rounds, not the child's samples
    verdict = json.loads((project / ".ditgate" / "verdict.json").read_text())
    shapes = next(record for record in verdict["quality"] if record["case"] == "shapes-ddim-20")
    assert shapes["passed"] and {"images.class_accuracy", "images.frechet_distance"} <= set(shapes["metrics"])
    assert "latents.rel_l2" in shapes["metrics"]  # judged as a latent, not as an image out of range
