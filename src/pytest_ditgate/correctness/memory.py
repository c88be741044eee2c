"""The memory a kernel check needs, what it held, and a clear failure when it cannot fit.

A check holds the inputs, one pristine copy of them (to detect mutation and to feed the reference; the whole
buffer of an input that is a view of a larger one, to see writes outside the view), the
candidate's outputs of two calls, and the reference's run on float64 copies: the copies themselves (8 bytes
per floating element) and whatever the reference allocates in float64, plus its outputs. Comparisons run
in chunks (:mod:`pytest_ditgate.correctness.compare`) and earlier trials' outputs are kept as fingerprints,
so the gate's own share stays a few times the inputs. :func:`estimate` states it; when the device (or the
host, for CPU tensors) has less free memory than that, or an allocation of the gate or the reference fails,
the check stops with a :class:`~pytest_ditgate.errors.DitgateResourceError` naming the sizes and what to
change, instead of an out-of-memory traceback from inside the gate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from pytest_ditgate.correctness.structure import named_tensors

GB = 1 << 30


def tensors_bytes(tensors: Iterable[Any]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclass(frozen=True)
class Estimate:
    """Bytes a trial needs beyond the inputs: their pristine copy, the reference's float64 (or float32)
    copies, and about as much again for the reference's outputs and intermediates (a lower bound: the
    reference may allocate more)."""

    inputs: int
    pristine: int
    upcast_copies: int

    @property
    def needed(self) -> int:
        return self.pristine + 2 * self.upcast_copies

    def to_dict(self) -> dict[str, int]:
        return {"inputs_bytes": self.inputs, "pristine_bytes": self.pristine,
                "upcast_copies_bytes": self.upcast_copies, "estimate_bytes": self.needed}

    def describe(self) -> str:
        return (f"inputs {_gb(self.inputs)}, their pristine copy {_gb(self.pristine)}, the reference's "
                f"float64 copies {_gb(self.upcast_copies)} and about as much again for its outputs and "
                f"intermediates: at least {_gb(self.needed)} beyond the inputs")


def estimate(inputs: Any, upcast_itemsize: int | None) -> Estimate:
    """The :class:`Estimate` for a call's tensors (``inputs``: ``(args, kwargs)``); ``upcast_itemsize`` is 8
    for a float64 reference, 4 for float32, None when the reference runs on the inputs' dtypes. The pristine
    copy holds the whole buffer of an input that is a view of a larger one
    (:mod:`pytest_ditgate.correctness.storage`)."""
    from pytest_ditgate.correctness.storage import pristine_bytes

    tensors = [t for _, t in named_tensors(inputs, "in")]
    size = tensors_bytes(tensors)
    floating = sum(t.numel() for t in tensors if t.is_floating_point() or t.is_complex())
    upcast = floating * upcast_itemsize if upcast_itemsize else size
    return Estimate(inputs=size, pristine=pristine_bytes(tensors), upcast_copies=upcast)


def free_bytes(device: Any) -> tuple[int | None, int | None]:
    """``(free, total)`` bytes on a CUDA device, or available host memory (its cgroup limit counted) for the
    CPU; None where unknown."""
    import torch

    if getattr(device, "type", None) == "cuda":
        try:
            free, total = torch.cuda.mem_get_info(device)
        except Exception:  # noqa: BLE001 - best effort: no figure rather than a failed check
            return None, None
        return int(free), int(total)
    return _host_available(), None


def _host_available() -> int | None:
    available = None
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_file, encoding="ascii") as handle:
                limit_text = handle.read().strip()
            with open(usage_file, encoding="ascii") as handle:
                usage = int(handle.read().strip())
        except (OSError, ValueError):
            continue
        if limit_text.isdigit() and int(limit_text) < (1 << 60):
            headroom = max(0, int(limit_text) - usage)
            available = headroom if available is None else min(available, headroom)
        break
    return available


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation failure (CUDA's OutOfMemoryError, the CPU allocator's, MemoryError)."""
    import torch

    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in text.lower() or "can't allocate memory" in text)


class Tracker:
    """Peak device memory of a check (CUDA devices: the allocator's peak, reset when the check starts)."""

    def __init__(self) -> None:
        self.devices: list[Any] = []
        self.baseline: dict[str, int] = {}

    def watch(self, devices: Iterable[Any]) -> None:
        import torch

        for device in devices:
            if getattr(device, "type", None) != "cuda" or str(device) in self.baseline:
                continue
            self.baseline[str(device)] = int(torch.cuda.memory_allocated(device))
            torch.cuda.reset_peak_memory_stats(device)
            self.devices.append(device)

    def held(self) -> dict[str, int]:
        import torch

        return {str(d): int(torch.cuda.memory_allocated(d)) for d in self.devices}

    def peaks(self) -> dict[str, dict[str, int]]:
        import torch

        return {str(d): {"peak_allocated_bytes": int(torch.cuda.max_memory_allocated(d)),
                         "before_bytes": self.baseline[str(d)]} for d in self.devices}


def resource_message(what: str, estimate_: Estimate | None, device: Any, held: dict[str, int],
                     error: BaseException | None = None) -> str:
    """The one-paragraph failure of a check that does not fit in memory."""
    free, total = free_bytes(device)
    where = str(device)
    lines = [f"kernel_check ran out of memory {what} on {where}"]
    if error is not None:
        lines[0] += f" ({type(error).__name__})"
    if estimate_ is not None:
        lines.append(f"a trial needs {estimate_.describe()}")
    if held:
        lines.append("the check held " + ", ".join(f"{_gb(v)} on {k}" for k, v in held.items()))
    if free is not None:
        lines.append(f"{where} has {_gb(free)} free" + (f" of {_gb(total)}" if total else ""))
    lines.append("to fit: draw smaller inputs in make_inputs (the check's verdict rarely needs the largest "
                 "shape), pass reference_dtype='float32' (halves the reference's copies; its own error then "
                 "limits fp32 candidates), or run on a device with more memory")
    return "; ".join(lines)


def _gb(value: int | None) -> str:
    if value is None:
        return "?"
    return f"{value / GB:.2f} GB" if value >= GB // 100 else f"{value / (1 << 20):.1f} MB"
