"""Ctrl-C while the judge starts (its imports, reading the project's settings) is one line and exit 130, never
a traceback: the judge has written nothing by then."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pytest_ditgate.experiment import judge
from pytest_ditgate.experiment.bootstrap import JUDGE


def test_ctrl_c_while_the_judge_reads_the_settings_is_one_line_and_130(tmp_path: Path, monkeypatch, capsys) -> None:
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(judge, "Judge", interrupted)
    assert judge.main(["baseline", "--lane", "fwd"]) == 130
    assert capsys.readouterr().err == "ditgate: baseline of lane 'fwd' interrupted before it began\n"
    assert list(tmp_path.iterdir()) == []


FAKE_JUDGE = """
import sys, types
module = types.ModuleType("pytest_ditgate.experiment.judge")
def main(argv):
    raise KeyboardInterrupt
module.main = main
sys.modules[module.__name__] = module
sys.argv = ["-c", {root!r}, "experiment", "--lane", "fwd"]
exec({code!r})
"""


@pytest.mark.parametrize("where", ["import", "run"])
def test_ctrl_c_in_the_judges_start_up_code_is_one_line_and_130(tmp_path: Path, where: str) -> None:
    """The start-up string itself (``bootstrap.JUDGE``), with the judge's module replaced by one that is
    interrupted as it is imported or as it runs."""
    fake = FAKE_JUDGE.format(root=str(tmp_path), code=JUDGE)
    if where == "import":  # the name is looked up as the import statement runs
        fake = fake.replace("module.main = main", "module.__getattr__ = main")
    done = subprocess.run([sys.executable, "-B", "-c", fake], capture_output=True, text=True, timeout=120)
    assert done.returncode == 130, done.stderr
    assert done.stderr == "ditgate: interrupted\n" and done.stdout == ""
