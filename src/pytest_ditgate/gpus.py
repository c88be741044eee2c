"""Scale-out over GPUs with pytest-xdist: one worker per GPU, and timing never overlapped on one GPU.

The controller hands each worker a GPU (``CUDA_VISIBLE_DEVICES`` pinned in the worker before CUDA is
initialised). When there are more workers than GPUs, workers share GPUs round-robin and
:func:`exclusive_gpu` serialises timed regions per physical GPU with a file lock, so no measurement ever
runs beside other work of this run on the same GPU.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from pytest_ditgate.context import get_context

WORKER_GPU_KEY = "ditgate_gpu"
LOCK_DIR_KEY = "ditgate_lock_dir"
PINNED_ENV = "DITGATE_PINNED_GPU"
LOCK_DIR_ENV = "DITGATE_GPU_LOCK_DIR"


def visible_gpus() -> list[str]:
    """GPU ids this process may use, without importing torch: CUDA_VISIBLE_DEVICES, else NVML, else nvidia-smi."""
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is not None:
        return [part.strip() for part in raw.split(",") if part.strip() and part.strip() != "-1"]
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        pass
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout
            return [str(i) for i, line in enumerate(l for l in out.splitlines() if l.startswith("GPU "))]
        except (OSError, subprocess.SubprocessError):
            pass
    return []


def assign_gpu(worker_id: str, gpus: list[str]) -> str | None:
    """Round-robin: ``gw0`` -> first GPU, ``gw1`` -> second, ... (None when there is no GPU)."""
    if not gpus:
        return None
    digits = "".join(ch for ch in worker_id if ch.isdigit())
    return gpus[int(digits or 0) % len(gpus)]


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:  # xdist controller hook
    config = node.config
    gpus = config.stash.get(_gpus_key, None)
    if gpus is None:
        gpus = visible_gpus()
        config.stash[_gpus_key] = gpus
    gpu = assign_gpu(node.workerinput["workerid"], gpus)
    if gpu is not None:
        node.workerinput[WORKER_GPU_KEY] = gpu
    node.workerinput[LOCK_DIR_KEY] = str(_lock_dir(config))


_gpus_key = pytest.StashKey[list]()


def _lock_dir(config: pytest.Config) -> Path:
    return get_context(config).artefact_dir / "locks"


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """In a worker: pin its GPU before anything initialises CUDA."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return
    gpu = workerinput.get(WORKER_GPU_KEY)
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
        os.environ[PINNED_ENV] = gpu
    if workerinput.get(LOCK_DIR_KEY):
        os.environ[LOCK_DIR_ENV] = workerinput[LOCK_DIR_KEY]


WORKER_REPORT_KEY = "ditgate_gpu_report"
_reports_key = pytest.StashKey[dict]()


def _worker_gpu_report() -> dict[str, str]:
    """What this worker ran on: its pinned CUDA_VISIBLE_DEVICES and, if CUDA is up, the device's name and UUID."""
    import sys

    report = {"visible": os.environ.get("CUDA_VISIBLE_DEVICES", "")}
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        report.update(name=str(props.name), uuid=str(getattr(props, "uuid", "")))
    return report


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput[WORKER_REPORT_KEY] = _worker_gpu_report()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:  # xdist controller hook
    report = getattr(node, "workeroutput", {}).get(WORKER_REPORT_KEY)
    if report is not None:
        node.config.stash.setdefault(_reports_key, {})[node.workerinput["workerid"]] = report


@pytest.hookimpl(trylast=True)  # after other plugins' sections: ditgate's summary is read last
def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    reports = config.stash.get(_reports_key, None)
    if not reports:
        return
    terminalreporter.section("ditgate GPUs per worker", sep="-")
    for worker, report in sorted(reports.items()):
        device = f" ({report['name']} {report['uuid']})" if report.get("name") else ""
        terminalreporter.write_line(f"{worker}: CUDA_VISIBLE_DEVICES={report['visible'] or '<unset>'}{device}")


def physical_gpu_id() -> str:
    """The id of the GPU this process times on (after pinning), for lock names and provenance."""
    pinned = os.environ.get(PINNED_ENV)
    if pinned is not None:
        return pinned
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return visible.split(",")[0].strip() if visible.strip() else "0"


@contextlib.contextmanager
def exclusive_gpu(gpu: str | None = None, *, timeout: float = 3600.0) -> Iterator[None]:
    """Hold this run's timing lock for one physical GPU (a no-op outside xdist runs)."""
    lock_root = os.environ.get(LOCK_DIR_ENV)
    if not lock_root:
        yield
        return
    from pytest_ditgate.fsutil import lock_for

    with lock_for(Path(lock_root) / f"gpu-{gpu or physical_gpu_id()}").acquire(timeout=timeout):
        yield

