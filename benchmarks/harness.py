"""What every benchmark script shares: the repository on ``sys.path``, logging, and guarded steps.

Importing this module puts the repository root (for ``kernels``/``dit_impl``) and ``src`` (for an
uninstalled ``pytest_ditgate``) first on ``sys.path``: the scripts run as ``python benchmarks/<name>.py``.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import Any, Callable

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
