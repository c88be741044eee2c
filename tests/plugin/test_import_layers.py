"""The plugin's layers (``[tool.importlinter]`` in pyproject.toml) hold, and an import against them fails
``lint-imports`` naming the contract and the import chain.

Each test runs ``lint-imports`` on a copy of ``src/pytest_ditgate`` and the project's pyproject.toml, with
empty stand-ins for the repository's workloads (``kernels``, ``dit_impl``: the forbidden contract names
them as root packages), so a test can add one import to the copy and watch it fail. One run takes about a
quarter of a second.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = "pytest_ditgate: layers from the entry points down to the torch-free base"


pytest.importorskip("importlinter", reason="import-linter is a test dependency (pip install -e '.[test]')")
#: ``lint-imports`` as this interpreter runs it (wheels installed with ``--target`` leave no script on PATH)
LINT_IMPORTS = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command as c; "
                                      "sys.argv[0] = 'lint-imports'; sys.exit(c())"]


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """``pytest_ditgate`` and pyproject.toml copied to ``tmp_path``, and empty workload packages beside them."""
    shutil.copytree(ROOT / "src" / "pytest_ditgate", tmp_path / "pytest_ditgate",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for workload in ("kernels", "dit_impl"):
        (tmp_path / workload).mkdir()
        (tmp_path / workload / "__init__.py").write_text("")
    return tmp_path


def lint(folder: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` run in ``folder`` (which it puts first on ``sys.path``: the copy is what it reads)."""
    return subprocess.run([*LINT_IMPORTS, "--no-cache"], cwd=folder, capture_output=True, text=True, timeout=120)


def add(copy: Path, module: str, code: str) -> None:
    path = copy / "pytest_ditgate" / module
    path.write_text(path.read_text() + "\n\n" + code)


def test_the_plugin_keeps_its_layers(copy: Path) -> None:
    result = lint(copy)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{LAYERS} KEPT" in result.stdout
    assert ", 0 broken." in result.stdout


@pytest.mark.parametrize(("module", "code", "chain"), [
    # an import inside a function counts (the base's vocabulary importing the verdict)
    ("dtypes.py", "def _rank():\n    from pytest_ditgate.verdict import outcome\n",
     "pytest_ditgate.dtypes -> pytest_ditgate.verdict.outcome"),
    # so does a type-checking one (the session state importing the command line)
    ("context.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pytest_ditgate import cli\n",
     "pytest_ditgate.context -> pytest_ditgate.cli"),
])
def test_an_upward_import_breaks_the_layers_with_its_chain(copy: Path, module: str, code: str, chain: str) -> None:
    add(copy, module, code)
    result = lint(copy)
    assert result.returncode != 0
    assert f"{LAYERS} BROKEN" in result.stdout
    assert chain in result.stdout, result.stdout


def test_a_module_left_out_of_the_layers_breaks_them(copy: Path) -> None:
    (copy / "pytest_ditgate" / "stray.py").write_text('"""Belongs to no layer."""\n')
    result = lint(copy)
    assert result.returncode != 0
    assert f"{LAYERS} BROKEN" in result.stdout
    assert "- pytest_ditgate.stray" in result.stdout


@pytest.mark.parametrize("workload", ["kernels", "dit_impl"])
def test_importing_a_workload_breaks_the_forbidden_contract(copy: Path, workload: str) -> None:
    add(copy, "bench/runner.py", f"def _workload():\n    import {workload}  # noqa: F401\n")
    result = lint(copy)
    assert result.returncode != 0
    assert "pytest_ditgate never imports the repository's workloads BROKEN" in result.stdout
    assert f"pytest_ditgate is not allowed to import {workload}" in result.stdout
    assert f"pytest_ditgate.bench.runner -> {workload}" in result.stdout


def test_torch_in_the_base_breaks_the_torch_free_contract(copy: Path) -> None:
    add(copy, "numbers.py", "def _tensor():\n    import torch  # noqa: F401\n")
    result = lint(copy)
    assert result.returncode != 0
    assert "the base is torch-free BROKEN" in result.stdout
    assert "pytest_ditgate.numbers -> torch" in result.stdout


def test_a_cycle_between_siblings_breaks_the_acyclic_contract(copy: Path) -> None:
    add(copy, "golden/comparator.py",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pytest_ditgate.golden.session import GoldenHit\n")
    result = lint(copy)
    assert result.returncode != 0
    assert "no import cycle among siblings BROKEN" in result.stdout
    assert "No cycles are allowed in pytest_ditgate.golden" in result.stdout
