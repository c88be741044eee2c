"""How the judged child leaves: exit handlers and streams first, no interpreter teardown (it costs seconds)."""

from __future__ import annotations

import subprocess

import pytest

from pytest_ditgate.experiment.bootstrap import CHILD, command

CONFTEST = '''
import atexit, pathlib, sys, threading, time

HERE = pathlib.Path(__file__).parent


SESSION_OVER = threading.Event()


def linger():  # a normal interpreter shutdown waits for this thread before anything else
    # timed from the session's end, not the process's start: a child slowed by a loaded machine still
    # leaves long before this, unless it waits for the thread
    SESSION_OVER.wait()
    time.sleep(10.0)
    (HERE / "torn_down").write_text("yes")


threading.Thread(target=linger, daemon=False).start()
atexit.register(lambda: (HERE / "exit_handler").write_text("ran"))


def pytest_unconfigure(config):
    sys.stdout.write("LAST WORDS OF THE SESSION")  # no newline: sits in the buffer of a piped stdout
    SESSION_OVER.set()
'''

TESTS = '''
def test_passes():
    pass

def test_fails():
    assert False
'''


def run_child(pytester: pytest.Pytester) -> subprocess.CompletedProcess[str]:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_work=TESTS)
    args = command(CHILD, str(pytester.path), "-q", "-p", "no:cacheprovider", "test_work.py")
    return subprocess.run(args, cwd=pytester.path, capture_output=True, text=True, timeout=120)


def test_the_child_keeps_pytests_exit_code_its_output_and_its_exit_handlers(pytester: pytest.Pytester) -> None:
    done = run_child(pytester)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed, 1 passed" in done.stdout
    assert done.stdout.endswith("LAST WORDS OF THE SESSION")  # flushed before leaving
    assert (pytester.path / "exit_handler").read_text() == "ran"


def test_the_child_skips_the_interpreter_teardown(pytester: pytest.Pytester) -> None:
    """The interpreter's shutdown sequence (waiting for threads, finalising modules, torch's CUDA context)
    is skipped: a lingering thread does not hold the judge up either."""
    done = run_child(pytester)
    assert done.returncode == 1, done.stdout + done.stderr
    assert not (pytester.path / "torn_down").exists()
