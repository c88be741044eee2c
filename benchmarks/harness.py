"""What every benchmark script shares: the repository on ``sys.path``, logging, guarded steps, and the
device's provenance and measured GEMM peak.

Importing this module puts the repository root (for ``kernels``/``dit_impl``) and ``src`` (for an
uninstalled ``pytest_ditgate``) first on ``sys.path``: the scripts run as ``python benchmarks/<name>.py``.
"""

from __future__ import annotations

import sys
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

ROOT = Path(__file__).resolve().parent.parent
for _path in (str(ROOT / "src"), str(ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)


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


class WrongResult(Exception):
    """A probe's case computed something else than its reference: recorded, never timed."""


def check_result(error: float, bound: float, reference: str) -> None:
    """Raise :class:`WrongResult` unless ``error`` (rel-L2 against the reference) is within ``bound`` (NaN is not)."""
    if not error <= bound:
        raise WrongResult(f"rel-L2 {error:.3e} against {reference}, bound {bound:.3e}")


@contextmanager
def one_case(entry: dict, tag: str, label: str) -> Iterator[None]:
    """One case of a probe: a wrong result or an error is recorded in ``entry["error"]`` and logged, and the
    next case runs (one case failing must not lose the others)."""
    try:
        yield
    except WrongResult as exc:
        entry["error"] = f"wrong result: {exc}"
        log(f"[{tag}] {label}: {entry['error']}")
    except Exception as exc:  # noqa: BLE001
        entry["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
        log(f"[{tag}] {label}: {entry['error']}")


def phase_profile(call: Callable[[], Any], label: str, folder: Path, test: str, timed_ms: float,
                  eager: Callable[[], Any] | None = None) -> dict[str, Any]:
    """The project's phase profile of one traced run of ``call`` (GEMM, attention, elementwise, copies, idle;
    top kernels; a Perfetto trace under ``folder/profiles/``), taken after its timing. ``eager``: where
    ``call`` replays a CUDA graph, the same computation without it, whose kernels lend theirs FLOPs and bytes."""
    from pytest_ditgate.bench.timers import Call
    from pytest_ditgate.bench.tracing import profile_call

    return profile_call(Call(call), label=label, artefact_dir=folder, test=test, timed_ms=timed_ms,
                        eager=None if eager is None else Call(eager)).to_dict()


def phase_table(profiles: list[tuple[str, dict[str, Any] | None]]) -> str:
    """Labelled phase profiles as ``pytest --ditgate --ditgate-profile`` prints them (missing ones left out)."""
    from pytest_ditgate.bench.report import profile_lines, profile_row

    return "\n".join(profile_lines([profile_row(label, profile) for label, profile in profiles if profile]))


def gemm_peak_tflops() -> tuple[float | None, str]:
    """The device profile's measured bf16 GEMM peak (TFLOP/s), or None, and where it comes from."""
    try:
        from pytest_ditgate.device import real_device
        from pytest_ditgate.profiles import peaks_for

        device = real_device()  # looked up as the phase profiles look it up (bench.tracing.profile_call)
        peaks, note = peaks_for(device.name, device.arch)
    except Exception as exc:  # noqa: BLE001 - rates are then absolute
        return None, f"no peak: {type(exc).__name__}: {exc}"
    peak = ((peaks or {}).get("tflops") or {}).get("bf16")
    return (float(peak) if peak else None), note


def environment() -> dict[str, Any]:
    """The project's provenance record of this machine (device, versions, host, commit, time)."""
    from pytest_ditgate.device import real_device
    from pytest_ditgate.environment import environment_record

    return environment_record(real_device())
