"""Starts the GPU check's read recorder (gpucheck_recorder.py) in every Python process of a recorded run, then
runs the ``sitecustomize`` this one shadows, if the interpreter has one further down ``sys.path``."""

import os as _os
import sys as _sys

try:
    import gpucheck_recorder as _recorder

    _recorder.start()
except Exception:  # noqa: BLE001 - a recorder that cannot start leaves the run as it is
    pass


def _chain() -> None:
    here = _os.path.dirname(_os.path.abspath(__file__))
    import importlib.machinery

    rest = [p for p in _sys.path if _os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.origin and _os.path.dirname(_os.path.abspath(spec.origin)) != here:
        import importlib.util

        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


try:
    _chain()
except Exception:  # noqa: BLE001
    pass
