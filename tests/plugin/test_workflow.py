"""The GitHub Actions workflow for the self-hosted A5500 runner: schema-valid and wired as documented."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

WORKFLOW = Path(__file__).resolve().parents[2] / ".github" / "workflows" / "ditgate.yml"


def _schema_check(workflow: Path) -> subprocess.CompletedProcess:
    """``check-jsonschema`` against GitHub's workflow schema (a test dependency; the GPU check's machine,
    which runs these tests too, does not carry it)."""
    beside = Path(sys.executable).with_name("check-jsonschema")
    exe = shutil.which("check-jsonschema") or (str(beside) if beside.exists() else None)
    if exe is None:
        pytest.skip("needs check-jsonschema, a test dependency (pip install -e '.[test]')")
    return subprocess.run([exe, "--builtin-schema", "vendor.github-workflows", str(workflow)],
                          capture_output=True, text=True, timeout=120)


def test_workflow_passes_the_github_workflow_schema() -> None:
    proc = _schema_check(WORKFLOW)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_schema_check_rejects_a_broken_workflow(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("name: x\non: [push]\njobs:\n  a:\n    runs_on: ubuntu\n    steps: 3\n")
    assert _schema_check(bad).returncode != 0


def test_gpu_job_targets_the_a5500_and_uploads_artefacts() -> None:
    import yaml
    flow = yaml.safe_load(WORKFLOW.read_text())
    gpu = flow["jobs"]["gpu-a5500"]
    assert {"self-hosted", "gpu", "a5500"} <= set(gpu["runs-on"])
    commands = "\n".join(step.get("run", "") for step in gpu["steps"])
    assert "--ditgate-target=a5500" in commands and "--junitxml" in commands
    assert "--ditgate-verdict-json" in commands and "ditgate report" in commands
    assert "--system-site-packages" in commands  # the runner's CUDA torch, not a CPU one
    upload = next(step for step in gpu["steps"] if str(step.get("uses", "")).startswith("actions/upload-artifact"))
    for artefact in ("verdict.json", "results.tsv", "report.html"):
        assert artefact in upload["with"]["path"]
    cpu = flow["jobs"]["cpu"]
    assert "./scripts/test" in "\n".join(step.get("run", "") for step in cpu["steps"])  # the README's tests
