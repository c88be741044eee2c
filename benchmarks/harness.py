"""What every benchmark script shares: the repository on ``sys.path``, logging, guarded steps, the
device's provenance and measured GEMM peak, a result record written under its arch, and the benchmarks' only
door into the package's non-public modules (:data:`INTERNAL`).

Importing this module puts the repository root (for ``kernels``/``dit_impl``) and ``src`` (for an
uninstalled ``pytest_ditgate``) first on ``sys.path``: the scripts run as ``python benchmarks/<name>.py``.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
for _path in (str(ROOT / "src"), str(ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

#: What the benchmarks take from the package's non-public modules: name -> (module, why). Everything else of
#: ``pytest_ditgate`` they take from its public API. The scripts import these names from here
#: (``from harness import Ledger``, inside the function that needs it), and each is resolved on first use:
#: importing harness imports none of the package, and a script imports only the modules it uses. A change
#: here, or of one of these names in the package, is a change of this surface (benchmarks/README.md).
INTERNAL: dict[str, tuple[str, str]] = {
    # provenance: every result file carries the plugin's own record of the machine
    "real_device": ("pytest_ditgate.device", "the detected device, never a profile"),
    "arch_label": ("pytest_ditgate.device_info", "the arch key (sm_90) that names results, goldens and ledgers"),
    "environment_record": ("pytest_ditgate.environment", "the record the plugin writes beside its own numbers"),
    # phase profiles, as ``pytest --ditgate --ditgate-profile`` takes and prints them (dit_bench)
    "Call": ("pytest_ditgate.bench.timers", "a callable as the tracer takes it"),
    "profile_call": ("pytest_ditgate.bench.tracing", "the phase profile of one traced call"),
    "profile_row": ("pytest_ditgate.bench.report", "one labelled row of the phase table"),
    "profile_lines": ("pytest_ditgate.bench.report", "the phase table's lines"),
    "peaks_for": ("pytest_ditgate.profiles", "the device profile's measured GEMM peak that rates a phase"),
    # what a benchmark measures is itself internal
    "Ledger": ("pytest_ditgate.bench.ledger", "timer_fidelity times the bench ledger's write"),
    "Evidence": ("pytest_ditgate.experiment.observe", "observer_overhead: what the judge's observer collects"),
    "make_observer": ("pytest_ditgate.experiment.observe", "observer_overhead: the observer it times"),
    # the quality gate's own metrics and checks, on the calibration's records (shapes_calibration, shapes_steps)
    "psnr_per_image": ("pytest_ditgate.quality.metrics", "a pixel metric of the contract, per image"),
    "ssim_per_image": ("pytest_ditgate.quality.metrics", "a pixel metric of the contract, per image"),
    "worst_tile_mae_per_image": ("pytest_ditgate.quality.metrics", "a pixel metric of the contract, per image"),
    "rel_l2": ("pytest_ditgate.quality.metrics", "a latent metric of the contract"),
    "cosine_similarity": ("pytest_ditgate.quality.metrics", "a latent metric of the contract"),
    "class_accuracy": ("pytest_ditgate.quality.learned", "a learned metric of the contract"),
    "frechet_distance": ("pytest_ditgate.quality.learned", "a learned metric of the contract"),
    "judge_recorded": ("pytest_ditgate.quality.evaluate", "the contract's checks replayed on recorded values"),
}


def internal(name: str) -> Any:
    """The name ``name`` of :data:`INTERNAL`, its module imported on first use."""
    if name not in INTERNAL:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(INTERNAL[name][0]), name)
    globals()[name] = value
    return value


__getattr__ = internal  # ``from harness import real_device`` (PEP 562)


def log(*parts: Any) -> None:
    """Progress on stderr, unbuffered (the table printed last goes to stdout)."""
    print(*parts, file=sys.stderr, flush=True)


def guarded(results: dict, key: str, fn: Callable[[], Any]) -> Any:
    """Run one piece; on error record it under ``key`` and carry on: one failing case must not lose the others."""
    try:
        value = fn()
    except Exception as exc:  # noqa: BLE001
        results[key] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=6)}
        log(f"[{key}] FAILED: {exc}")
        return None
    results[key] = value
    return value


def phase_profile(call: Callable[[], Any], label: str, folder: Path, test: str, timed_ms: float,
                  eager: Callable[[], Any] | None = None) -> dict[str, Any]:
    """The project's phase profile of one traced run of ``call`` (GEMM, attention, elementwise, copies, idle;
    top kernels; a Perfetto trace under ``folder/profiles/``), taken after its timing. ``eager``: where
    ``call`` replays a CUDA graph, the same computation without it, whose kernels lend theirs FLOPs and bytes."""
    Call, profile_call = internal("Call"), internal("profile_call")

    return profile_call(Call(call), label=label, artefact_dir=folder, test=test, timed_ms=timed_ms,
                        eager=None if eager is None else Call(eager)).to_dict()


def phase_table(profiles: list[tuple[str, dict[str, Any] | None]]) -> str:
    """Labelled phase profiles as ``pytest --ditgate --ditgate-profile`` prints them (missing ones left out)."""
    profile_lines, profile_row = internal("profile_lines"), internal("profile_row")

    return "\n".join(profile_lines([profile_row(label, profile) for label, profile in profiles if profile]))


def gemm_peak_tflops() -> tuple[float | None, str]:
    """The device profile's measured bf16 GEMM peak (TFLOP/s), or None, and where it comes from."""
    try:
        real_device, peaks_for = internal("real_device"), internal("peaks_for")

        device = real_device()  # looked up as the phase profiles look it up (bench.tracing.profile_call)
        peaks, note = peaks_for(device.name, device.arch)
    except Exception as exc:  # noqa: BLE001 - rates are then absolute
        return None, f"no peak: {type(exc).__name__}: {exc}"
    peak = ((peaks or {}).get("tflops") or {}).get("bf16")
    return (float(peak) if peak else None), note


def environment() -> dict[str, Any]:
    """The project's provenance record of this machine (device, versions, host, commit, time)."""
    real_device, environment_record = internal("real_device"), internal("environment_record")

    return environment_record(real_device())


def write_record(out: Any, name: str, record: dict[str, Any]) -> Any:
    """``record`` written as ``<out>/<name>_<arch>.json`` (the arch from its ``environment`` record), the folder
    made where missing; returns the path, or None without an ``out`` folder."""
    import json

    if out is None:
        return None
    path = Path(out) / f"{name}_{record['environment']['device']['arch']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")
    return path


def write_table(target: Any, record: dict[str, Any], lines: list[str]) -> Path:
    """``record`` as JSON at ``target`` and its table ``lines`` beside it (``.txt``), the folder made where
    missing; the table printed. Returns the JSON's path."""
    import json

    path = Path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, default=str) + "\n", encoding="utf-8")
    path.with_suffix(".txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return path


def end_to_end_ms(fn: Callable[[], Any], total_ms: float = 20.0, bursts: int = 1, lead_ms: float = 0.0) -> float:
    """The end-to-end truth of a call: milliseconds per call of many back-to-back calls, host clock, one device
    synchronisation at the end (what nvbench's "cold" loop and triton's ``do_bench`` measure: what a caller waits
    for, host work and launch gaps included); the count sized for about ``total_ms``. With ``bursts``, the
    median of that many such bursts run one after another: a host stall in one burst is not the truth, and
    the device runs as long as a measurement of ``bursts * total_ms`` keeps it busy. ``lead_ms`` of untimed
    back-to-back calls come first (a measurement's warm-up: the timed window starts as late)."""
    import statistics
    import time

    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    once = (time.perf_counter() - start) * 1e3
    count = max(10, min(20_000, int(total_ms / max(once, 1e-4))))
    for _ in range(int(lead_ms / max(once, 1e-4))):
        fn()
    per_call = []
    for _ in range(max(1, bursts)):
        start = time.perf_counter()
        for _ in range(count):
            fn()
        torch.cuda.synchronize()
        per_call.append((time.perf_counter() - start) * 1e3 / count)
    return statistics.median(per_call)
