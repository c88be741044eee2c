"""The GPU check on a machine of several GPUs: one lane per GPU, the lanes in parallel.

A lane runs its parts one after another in a thread of the check; every process it starts sees only its GPU
(``CUDA_VISIBLE_DEVICES``) and runs on its own slice of the host's cores (``gpu_lane_exec.py`` pins it before
it starts). The main thread merges each finished part into the record, so nothing that writes the record runs
in two threads. On SIGINT (the device call's limit) the main thread stops the lanes, kills every process group
they started, merges the parts that had finished and re-raises. Standard library only.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

LAUNCHER = Path(__file__).resolve().parent / "gpu_lane_exec.py"
CPUS_ENV = "GPUCHECK_LANE_CPUS"


@dataclass(frozen=True)
class Lane:
    """One GPU (``device``: its ``CUDA_VISIBLE_DEVICES`` value) and the host cores its processes run on."""

    index: int
    device: str
    cpus: tuple[int, ...]

    def env(self) -> dict[str, str]:
        """What a process of this lane has in its environment: its GPU alone, and its cores for the launcher."""
        return {"CUDA_VISIBLE_DEVICES": self.device, CPUS_ENV: ",".join(map(str, self.cpus))}

    def folder(self, logs: Path) -> Path:
        """This lane's logs and recordings, apart from the other lanes' (the stages name their files alike)."""
        return logs / f"lane-{self.index}"


def cpu_slices(cpus: Sequence[int], count: int) -> list[tuple[int, ...]]:
    """``count`` disjoint contiguous slices of equal size of ``cpus`` (the remainder unused); with fewer cores
    than lanes, one core each, shared."""
    cpus = sorted(cpus)
    size = len(cpus) // count
    if size == 0:
        return [(cpus[index % len(cpus)],) for index in range(count)]
    return [tuple(cpus[index * size:(index + 1) * size]) for index in range(count)]


def machine_lanes(count: int, cpus: Sequence[int] | None = None, visible: str | None = None) -> list[Lane]:
    """A lane per GPU for ``count`` GPUs: the GPUs as this process sees them (``visible``: its own
    ``CUDA_VISIBLE_DEVICES``, whose n-th entry is device n), the cores it may use split among them."""
    cpus = sorted(os.sched_getaffinity(0)) if cpus is None else cpus
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    devices = [d.strip() for d in visible.split(",") if d.strip()] if visible else []
    return [Lane(index, devices[index] if index < len(devices) else str(index), cores)
            for index, cores in enumerate(cpu_slices(cpus, count))]


def pinned(command: list[str], env: dict[str, str]) -> list[str]:
    """``command`` started through the launcher when ``env`` is a lane's (it names the lane's cores)."""
    if not env.get(CPUS_ENV):
        return command
    return [sys.executable, str(LAUNCHER), *command]


# -- the process groups every lane started --------------------------------------------------------------------

class ProcessGroups:
    """The process groups the stages started and have not seen end. A stop kills every one, and any started
    after it at once (a lane may be starting one as the stop comes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[int, subprocess.Popen] = {}
        self._stopped = False

    def reopen(self) -> None:
        """A new call: processes may start again."""
        with self._lock:
            self._stopped = False

    def started(self, process: subprocess.Popen) -> None:
        with self._lock:
            self._live[process.pid] = process
            if self._stopped:
                kill_group(process.pid)

    def ended(self, process: subprocess.Popen) -> None:
        with self._lock:
            self._live.pop(process.pid, None)

    def kill_all(self) -> None:
        with self._lock:
            self._stopped = True
            for pid in list(self._live):
                kill_group(pid)


def kill_group(pid: int) -> None:
    """SIGKILL to the process group ``pid`` leads (gone already: nothing to do)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


#: every process group the stages start (gpu_stages registers each; the lanes' stop kills them)
GROUPS = ProcessGroups()


class Occupancy:
    """For a part that ran: the most other lanes busy at once while it ran (its timings shared the host's
    cores, memory and PCIe with theirs)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._peak: dict[int, int] = {}

    def begin(self, lane: int) -> None:
        with self._lock:
            self._peak[lane] = 0
            for busy in self._peak:
                self._peak[busy] = max(self._peak[busy], len(self._peak) - 1)

    def end(self, lane: int) -> int:
        with self._lock:
            return self._peak.pop(lane)


# -- running the lanes ----------------------------------------------------------------------------------------

_LANE_DONE = object()


def run_lanes(work: list[tuple[Lane, list[Any]]], run: Callable[[Lane, Any], Any],
              done: Callable[[Any, Any, int], None], poll_s: float = 0.5) -> None:
    """Run each lane's jobs one after another (``run(lane, job)`` in the lane's thread), the lanes in parallel,
    and call ``done(job, outcome, lanes_beside)`` in this thread as each job finishes. A job that raises, or
    SIGINT here, stops every lane: their process groups are killed, jobs that finished before the stop are
    still handed to ``done``, and the exception is raised again."""
    GROUPS.reopen()
    finished: queue.Queue = queue.Queue()
    stop = threading.Event()
    occupancy = Occupancy()

    def lane_loop(lane: Lane, jobs: list[Any]) -> None:
        for job in jobs:
            if stop.is_set():
                break
            occupancy.begin(lane.index)
            try:
                outcome = run(lane, job)
            except BaseException as exc:  # reported to the main thread, which stops the check
                outcome = exc
            beside = occupancy.end(lane.index)
            if stop.is_set() and not isinstance(outcome, BaseException):
                break  # its processes may have been killed by the stop: no result
            finished.put((job, outcome, beside))
        finished.put(_LANE_DONE)

    threads = [threading.Thread(target=lane_loop, args=(lane, jobs), name=f"gpu-lane-{lane.index}", daemon=True)
               for lane, jobs in work]
    for thread in threads:
        thread.start()
    try:
        _hand_over(finished, done, len(threads), poll_s)
    except BaseException:
        stop.set()
        GROUPS.kill_all()
        for thread in threads:
            thread.join(timeout=10)  # within the call's grace before SIGKILL
        _drain(finished, done)
        raise


def _hand_over(finished: queue.Queue, done: Callable[[Any, Any, int], None], lanes: int, poll_s: float) -> None:
    """Hand each finished job to ``done`` until every lane has ended; a job's exception is raised here."""
    while lanes:
        try:
            item = finished.get(timeout=poll_s)
        except queue.Empty:
            continue
        if item is _LANE_DONE:
            lanes -= 1
            continue
        job, outcome, beside = item
        if isinstance(outcome, BaseException):
            raise outcome
        done(job, outcome, beside)


def _drain(finished: queue.Queue, done: Callable[[Any, Any, int], None]) -> None:
    """After a stop: hand over the jobs that finished before it."""
    while True:
        try:
            item = finished.get_nowait()
        except queue.Empty:
            return
        if item is not _LANE_DONE and not isinstance(item[1], BaseException):
            done(*item)
