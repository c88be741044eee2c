"""Start a command on its lane's CPU cores: ``python gpu_lane_exec.py COMMAND...`` pins this process to
the cores named in ``GPUCHECK_LANE_CPUS`` (comma-separated) and replaces itself with COMMAND (same pid, same
environment).

Why a launcher rather than pinning from the GPU check: a process's CPU mask is inherited by every thread and
child it starts, so pinning it before it runs anything holds for the whole process tree, whichever lane thread
of the GPU check started it. ``preexec_fn`` is not safe in a process with threads, a thread's own mask is what
its children inherit only by an undocumented Linux detail, and pinning a running child from outside races with
the threads it starts first. Not isolated: the read recorder loads here as in every Python process the check
starts (a process started without it leaves its unit's inputs unknown), and again in the command it becomes.
"""

import os
import sys

CPUS_ENV = "GPUCHECK_LANE_CPUS"


def main(command: list[str]) -> None:
    cpus = {int(cpu) for cpu in os.environ[CPUS_ENV].split(",") if cpu}
    os.sched_setaffinity(0, cpus)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
