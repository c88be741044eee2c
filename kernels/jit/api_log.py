"""API logging before each kernel launch, so that the inputs of a crashing call survive the crash.

``DITGATE_KERNELS_LOGLEVEL`` (read when a function is decorated, i.e. at import):

* 0 (default): off; :func:`api_log` returns the function itself, so there is no overhead at all;
* 1: function names;
* 3: plus inputs and outputs: shapes, dtypes, strides, devices, scalar arguments;
* 5: plus tensor statistics (min, max, mean, NaN and Inf counts); skipped during CUDA graph capture;
* 10: plus dumps of inputs and outputs as safetensors in ``DITGATE_KERNELS_DUMP_DIR``, bounded by
  ``DITGATE_KERNELS_DUMP_MAX_COUNT`` (files, default 64) and ``DITGATE_KERNELS_DUMP_MAX_BYTES``
  (default 1 GiB) per process, filtered by ``DITGATE_KERNELS_DUMP_INCLUDE`` / ``..._EXCLUDE``
  (comma-separated fnmatch patterns on the function name).

Lines go to ``DITGATE_KERNELS_LOGDEST``: ``stderr`` (default), ``stdout`` or a file path; each line
is flushed before the kernel launches.
"""

from __future__ import annotations

import fnmatch
import functools
import inspect
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

LEVEL = "DITGATE_KERNELS_LOGLEVEL"
DEST = "DITGATE_KERNELS_LOGDEST"
DUMP_DIR = "DITGATE_KERNELS_DUMP_DIR"
DUMP_MAX_COUNT = "DITGATE_KERNELS_DUMP_MAX_COUNT"
DUMP_MAX_BYTES = "DITGATE_KERNELS_DUMP_MAX_BYTES"
DUMP_INCLUDE = "DITGATE_KERNELS_DUMP_INCLUDE"
DUMP_EXCLUDE = "DITGATE_KERNELS_DUMP_EXCLUDE"

F = TypeVar("F", bound=Callable[..., Any])


def current_level() -> int:
    raw = os.environ.get(LEVEL, "0").strip() or "0"
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{LEVEL}={raw!r} is not an integer (0, 1, 3, 5 or 10)") from None


def _emit(line: str) -> None:
    dest = os.environ.get(DEST, "stderr")
    if dest == "stdout":
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
    elif dest in ("", "stderr"):
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    else:
        with open(dest, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()


def _is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _capturing() -> bool:
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
    except Exception:  # noqa: BLE001 - a diagnostic helper must never break the call it logs
        return False


def _stats(t: Any) -> str:
    if t.numel() == 0:
        return " stats=empty"
    if not (t.is_floating_point() or t.is_complex()):
        v = t.double()
        return f" min={v.min().item():.6g} max={v.max().item():.6g} mean={v.mean().item():.6g}"
    v = t.detach().float()
    finite = v[v.isfinite()]
    nan = int(v.isnan().sum().item())
    inf = int(v.isinf().sum().item())
    if finite.numel() == 0:
        return f" nan={nan} inf={inf} (no finite values)"
    return (f" min={finite.min().item():.6g} max={finite.max().item():.6g} mean={finite.mean().item():.6g}"
            f" nan={nan} inf={inf}")


def describe(value: Any, level: int) -> str:
    """One value as logged: tensors by layout (and statistics from level 5), others by a short repr."""
    if _is_tensor(value):
        text = (f"Tensor(shape={tuple(value.shape)}, dtype={str(value.dtype).replace('torch.', '')}, "
                f"stride={tuple(value.stride())}, device={value.device})")
        if level >= 5:
            text += " stats skipped (CUDA graph capture)" if _capturing() else _stats(value)
        return text
    if isinstance(value, (tuple, list)):
        inner = ", ".join(describe(v, level) for v in value)
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


class _DumpBudget:
    """Per-process count and byte budget for level-10 dumps."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0
        self.bytes = 0
        self.sequence = 0

    def reset(self) -> None:
        with self.lock:
            self.count = self.bytes = self.sequence = 0


_BUDGET = _DumpBudget()


def reset_dump_budget() -> None:
    _BUDGET.reset()


def _patterns(name: str) -> list[str]:
    return [p.strip() for p in os.environ.get(name, "").split(",") if p.strip()]


def dump_selected(function: str) -> bool:
    include, exclude = _patterns(DUMP_INCLUDE), _patterns(DUMP_EXCLUDE)
    if include and not any(fnmatch.fnmatchcase(function, p) for p in include):
        return False
    return not any(fnmatch.fnmatchcase(function, p) for p in exclude)


def _dump(function: str, kind: str, named: dict[str, Any]) -> None:
    """Write the tensors of ``named`` to one safetensors file if the filters and the budget allow."""
    folder = os.environ.get(DUMP_DIR)
    if not folder or not dump_selected(function) or _capturing():
        return
    tensors = {k: v for k, v in named.items() if _is_tensor(v)}
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    max_count = int(os.environ.get(DUMP_MAX_COUNT, "64"))
    max_bytes = int(os.environ.get(DUMP_MAX_BYTES, str(1 << 30)))
    with _BUDGET.lock:
        if _BUDGET.count + 1 > max_count or _BUDGET.bytes + size > max_bytes:
            _emit(f"[kernels.api] {function}: {kind} dump skipped (budget: {_BUDGET.count}/{max_count} files, "
                  f"{_BUDGET.bytes + size}/{max_bytes} bytes)")
            return
        _BUDGET.count += 1
        _BUDGET.bytes += size
        _BUDGET.sequence += 1
        sequence = _BUDGET.sequence
    from safetensors.torch import save_file

    others = {k: describe(v, 3) for k, v in named.items() if not _is_tensor(v)}
    metadata = {"function": function, "kind": kind, "arguments": json.dumps(others), "pid": str(os.getpid())}
    path = Path(folder) / f"{os.getpid()}_{sequence:05d}_{function}_{kind}.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: t.detach().contiguous().cpu() for k, t in tensors.items()}, str(path), metadata=metadata)
    _emit(f"[kernels.api] {function}: {kind} dumped to {path}")


def api_log(fn: F | None = None, *, name: str | None = None) -> F | Callable[[F], F]:
    """Decorate a public kernel API; at level 0 this returns ``fn`` unchanged (zero overhead)."""
    if fn is None:
        return lambda f: api_log(f, name=name)  # type: ignore[return-value]
    level = current_level()
    if level <= 0:
        return fn
    function = name or fn.__name__
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def logged(*args: Any, **kwargs: Any) -> Any:
        stamp = time.strftime("%H:%M:%S")
        if level < 3:
            _emit(f"[kernels.api {stamp}] {function}")
            return fn(*args, **kwargs)
        try:
            bound = signature.bind(*args, **kwargs)
            named = dict(bound.arguments)
        except TypeError:
            named = {f"arg{i}": a for i, a in enumerate(args)} | kwargs
        lines = [f"[kernels.api {stamp}] {function}("] + [f"    {k}={describe(v, level)}" for k, v in named.items()]
        _emit("\n".join(lines) + "\n  ) launching")
        if level >= 10:
            _dump(function, "inputs", named)
        result = fn(*args, **kwargs)
        outputs = result if isinstance(result, tuple) else (result,)
        _emit(f"[kernels.api] {function} -> " + ", ".join(describe(v, level) for v in outputs))
        if level >= 10:
            _dump(function, "outputs", {f"out{i}": v for i, v in enumerate(outputs)})
        return result

    logged.api_log_level = level  # type: ignore[attr-defined]
    return logged  # type: ignore[return-value]
