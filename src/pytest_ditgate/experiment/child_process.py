"""The lane's tests in one child pytest process (with ``child.py``'s recorder): started, waited for, and
nothing it started left running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from pytest_ditgate.experiment.bootstrap import CHILD, command
from pytest_ditgate.experiment.child_output import PrefixedPump
from pytest_ditgate.experiment.rounds import become_subreaper, strays
from pytest_ditgate.judged_run import JUDGE_TIMES_ENV, LANE_BEST, OUT_ENV

if TYPE_CHECKING:
    from pytest_ditgate.verdict.lane import LaneSpec

#: the judge imports what it compares with while the child runs only on a machine with at least this many
#: usable CPUs. On fewer, its import thread takes a core from the candidate's timed torch threads: on two
#: cores a no-op's re-measure against the lane best can read 0.79 (CI 0.19..0.92), enough to keep it, because
#: calls take 1.4 ms or, whenever a thread of the child's pool waits for the core, 5.6 ms (a third of them)
OVERLAP_MIN_CPUS = 8
#: how long the judge waits, after a Ctrl-C, for its child to end on its own before it kills it
INTERRUPT_GRACE_S = 60.0


def run_child(root: Path, lane: LaneSpec, declared: str, judge_env: Mapping[str, str], out: Path, *, freeze: bool,
              best: dict[str, Any] | None) -> int:
    """Run the lane's tests in the child, writing into ``out`` (``freeze``: the baseline's first run, which
    freezes the missing goldens); the child's exit code."""
    out.mkdir(parents=True, exist_ok=False)
    if best is not None and best.get("candidate_config"):
        (out / LANE_BEST).write_text(json.dumps(best, default=str))
    env = child_env(judge_env)
    env[OUT_ENV] = str(out)
    if lane.timing is not None:
        # the judge times the lane: the child leaves its timing tests out, in the baseline's freezing run too (its
        # speed is not judged, and those tests never run in a judged run, so they have nothing to freeze)
        env[JUDGE_TIMES_ENV] = "1"
    args = ["--ditgate", f"--ditgate-lane={lane.name}", f"--ditgate-class={declared}",
            f"--ditgate-dir={out / 'artefacts'}", "-p", "pytest_ditgate.experiment.child",
            "-p", "no:cacheprovider", "-q", "-rfEs", "--durations=5", *(["--ditgate-freeze"] if freeze else []),
            *lane.tests]
    print("ditgate: judged run:", "pytest", " ".join(args), flush=True)
    overlap = cores_to_spare()

    become_subreaper()  # a process the child leaves behind stays the judge's to find and end
    read_end, write_end = os.pipe()
    try:
        child = subprocess.Popen(command(CHILD, str(root), *args), cwd=root, env=env,
                                 stdout=write_end, stderr=write_end)
    finally:
        os.close(write_end)
    sys.stdout.flush()
    pump = PrefixedPump(read_end, sys.stdout, out / "child.log").start()
    try:
        if overlap:
            _warm_imports()  # while the child runs: the comparison's imports cost the judge no wall time
    finally:
        returncode, interrupted = wait_through_interrupts(child)
        left = end_descendants()
        pump.finish()
    if left:
        print(f"ditgate: ended {len(left)} process(es) the child left running: {', '.join(left[:3])}", flush=True)
    if interrupted:  # only now: the caller puts the tree back, which the child may no longer write to
        raise KeyboardInterrupt
    return returncode


def wait_through_interrupts(child: subprocess.Popen, grace_s: float = INTERRUPT_GRACE_S) -> tuple[int, bool]:
    """Wait for ``child`` to end, Ctrl-C or not: ``(exit code, interrupted)``. A Ctrl-C at a terminal reaches
    the child too, which then still runs its session's end (a freezing run rewrites the fixed-paths lock
    there); a baseline that put its tree back meanwhile would find the lock rewritten after it. So the judge
    waits for the child, up to ``grace_s`` after the first Ctrl-C, and kills it at a second one or then."""
    import time

    interrupted = False
    deadline: float | None = None
    while True:
        try:
            if deadline is None:
                return child.wait(), interrupted
            return child.wait(timeout=max(0.0, deadline - time.monotonic())), interrupted
        except KeyboardInterrupt:
            if interrupted:
                _kill(child)
                deadline = None
            else:
                interrupted = True
                deadline = time.monotonic() + grace_s
                print("ditgate: interrupted: waiting for the lane's tests to end (Ctrl-C again to kill them)",
                      file=sys.stderr, flush=True)
        except subprocess.TimeoutExpired:
            _kill(child)
            deadline = None


def _kill(child: subprocess.Popen) -> None:
    try:
        child.kill()
    except OSError:
        pass


def child_env(judge_env: Mapping[str, str]) -> dict[str, str]:
    """The environment of every process the judge starts: no ditgate or pytest switches, no bytecode."""
    env = {k: v for k, v in judge_env.items() if not k.startswith(("DITGATE_", "PYTEST_"))}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def end_descendants() -> list[str]:
    """End every process the judge's children left behind (found as the judge's descendants, which a subreaper
    keeps them): nothing of a run outlives it, or writes after the verdict. The ones ended, as ``pid (command)``."""
    left = strays(set())
    for entry in left:
        try:
            os.kill(int(entry.split(" ", 1)[0]), signal.SIGKILL)
        except (OSError, ValueError):
            pass
    return left


def cores_to_spare() -> bool:
    """Whether the judge can work beside its child without slowing the child's timed calls."""
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 1
    return usable >= OVERLAP_MIN_CPUS


def machine_arch() -> str:
    """This machine's arch (no SDPA probe, no CUDA context: the child is using the device meanwhile)."""
    from pytest_ditgate.device import device_arch

    return device_arch()


def _warm_imports() -> None:
    """Import what judging the child's evidence needs (torch, safetensors, the quality evaluator and the
    image metrics it calls: torchmetrics' first import alone takes seconds)."""
    try:
        import safetensors.torch  # noqa: F401

        import pytest_ditgate.golden.session  # noqa: F401
        import pytest_ditgate.quality.evaluate  # noqa: F401
        machine_arch()
    except ImportError:
        return  # reported where it is needed
    try:
        import torchmetrics.functional.image  # noqa: F401
    except ImportError:
        pass  # optional: only image metrics need it
