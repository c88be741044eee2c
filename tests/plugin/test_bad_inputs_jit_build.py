"""A killed JIT build must not leave ninja/nvcc writing into the folder the next build uses.

A fake ``nvcc`` (a shell script) stands in for the toolkit, so this runs on any POSIX machine in about
a second: the first build is SIGKILLed while its tool sleeps; the next build (same build folder) kills the
orphaned tool group, removes the stale attempt folder and produces the library from its own attempt.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernels.jit import builder

pytestmark = pytest.mark.skipif(not hasattr(os, "killpg") or not Path("/proc").is_dir(), reason="needs Linux /proc")

FAKE_NVCC = """#!/bin/sh
for a; do last=$a; done
if [ -n "$DITGATE_TEST_SLOW_NVCC" ]; then sleep 60; fi
echo built > "$last"
"""


def _commands(tmp_path: Path) -> tuple[Path, builder.BuildCommands]:
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(FAKE_NVCC)
    nvcc.chmod(0o755)
    source = tmp_path / "k.cu"
    source.write_text("// kernel\n")
    build = tmp_path / "build"
    commands = builder.BuildCommands(str(nvcc), ((str(source), str(build / "k.o"), ("-O2",)),), ("-shared",),
                                     str(build / "libk.so"))
    return build, commands


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_killed_build_leaves_nothing_running_for_the_next_one(tmp_path: Path) -> None:
    build, commands = _commands(tmp_path)
    script = (f"import sys; sys.path[:0] = {sys.path!r}\n"
              "from pathlib import Path\nfrom kernels.jit import builder\n"
              f"builder.run_build('k', Path({str(build)!r}), builder.BuildCommands({commands.nvcc!r}, "
              f"{commands.compiles!r}, {commands.link_flags!r}, {commands.output!r}), 1)\n")
    env = {**os.environ, "DITGATE_TEST_SLOW_NVCC": "1"}
    first = subprocess.Popen([sys.executable, "-c", script], env=env)
    owner, deadline = None, time.monotonic() + 30
    while time.monotonic() < deadline:
        found = [json.loads(p.read_text()) for p in build.glob(".attempt-*/owner.json") if p.stat().st_size]
        if found and found[0].get("pgid"):
            owner = found[0]
            break
        time.sleep(0.05)
    assert owner is not None, "the first build never started its tool"
    time.sleep(0.3)  # let the tool reach its sleep
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert _group_alive(owner["pgid"]), "precondition: kill -9 of the build leaves its tools running"
    tool = builder.run_build("k", build, commands, 1)
    assert tool in ("ninja", "nvcc")
    assert not _group_alive(owner["pgid"]), "the orphaned ninja/nvcc of the killed build is still running"
    assert Path(commands.output).read_text() == "built\n"
    assert list(build.glob(".attempt-*")) == []
