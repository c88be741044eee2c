"""``rated``: tell a phase profile what a launch computes when torch cannot (a DSL GEMM, a raw Triton kernel).

torch's profiler counts FLOPs and records shapes only for its own ops. A kernel launched by a library's own
runtime (quack's CuTe-DSL GEMMs, a ``@triton.jit`` function called directly) has no op, so its profile row
has no TFLOP/s or GB/s (a custom op such as quack's ``quack::gemm_out`` has an op, but torch counts no
FLOPs for it). ``with rated("qkv", flops=2 * m * n * k, dtype="bf16"): launch()`` opens a profiler range
whose name carries the amounts; the profiler spans the range on the device over the kernels launched in it
(a ``gpu_user_annotation``), and the profile credits the amounts to the longest kernel inside that span that
has none of its own. Outside a profiler it does nothing (no range, no cost beyond one check), and inside a
CUDA graph capture it records nothing either: a replay's kernels take their amounts from an eager run
(``profile_eager``).
"""

from __future__ import annotations

import re
import sys
from contextlib import contextmanager
from typing import Any, Iterator

from pytest_ditgate.dtypes import PEAK_KEY_OF, PEAK_KEYS, torch_name
from pytest_ditgate.errors import DitgateUsageError

#: the range name's prefix; the timers leave every ``ditgate::`` range out of their device spans
PREFIX = "ditgate::rated"
_NAME = re.compile(r"^ditgate::rated\[(?P<label>[^\]]*)\](?P<fields>(?: [a-z]+=[A-Za-z0-9]+)*)$")


def _dtype_key(dtype: Any) -> Any:
    """A torch dtype (``torch.bfloat16``) as its peak key (``"bf16"``); a key, or anything else, as it is."""
    if isinstance(dtype, str):
        return dtype
    return PEAK_KEY_OF.get(torch_name(dtype), dtype)


def range_name(label: str, flops: int | None = None, bytes: int | None = None, dtype: Any = None) -> str:
    """The profiler range name that carries ``flops``/``bytes``/``dtype`` (checked: non-negative integers, a
    known dtype key or a torch dtype that has one, a label without brackets)."""
    if not isinstance(label, str) or "[" in label or "]" in label:
        raise DitgateUsageError(f"rated label must be a string without brackets, got {label!r}")
    fields = []
    for key, value in (("flops", flops), ("bytes", bytes)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise DitgateUsageError(f"rated {key} must be a non-negative int, got {value!r}")
        fields.append(f"{key}={value}")
    dtype = _dtype_key(dtype)
    if dtype is not None:
        if dtype not in PEAK_KEYS:
            raise DitgateUsageError(f"rated dtype must be one of {', '.join(PEAK_KEYS)}, got {dtype!r}")
        fields.append(f"dtype={dtype}")
    if flops is None and bytes is None:
        raise DitgateUsageError("rated needs flops or bytes (or both)")
    return f"{PREFIX}[{label}]" + "".join(f" {field}" for field in fields)


def parse_range(name: str) -> dict[str, Any] | None:
    """The amounts a ``rated`` range name carries ({"flops", "bytes", "dtype"}, missing ones None), or None
    for any other name (malformed ones included: a profile never fails on a name)."""
    match = _NAME.match(name)
    if match is None:
        return None
    amounts: dict[str, Any] = {"label": match["label"], "flops": None, "bytes": None, "dtype": None}
    for field in match["fields"].split():
        key, _, value = field.partition("=")
        if key in ("flops", "bytes") and value.isdigit():
            amounts[key] = int(value)
        elif key == "dtype" and value in PEAK_KEYS:
            amounts[key] = value
    return amounts


def _profiling() -> bool:
    """Whether a torch profiler is recording; never imports torch (no torch loaded: no profiler either)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    flag = getattr(torch.autograd.profiler, "_is_profiler_enabled", None)
    return bool(flag) if flag is not None else bool(torch._C._autograd._profiler_enabled())


@contextmanager
def rated(label: str, *, flops: int | None = None, bytes: int | None = None,
          dtype: Any = None) -> Iterator[None]:
    """Mark the launches inside with what they compute (``flops``) and move (``bytes``), so a phase profile
    can rate a kernel no torch op launched. A no-op unless a profiler is recording (the amounts are checked
    then: an eager hot path pays one check, not a string)."""
    if not _profiling():
        yield
        return
    import torch

    with torch.profiler.record_function(range_name(label, flops, bytes, dtype)):
        yield
