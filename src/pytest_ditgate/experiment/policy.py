"""What the judge refuses and records about the environment it was started in.

The lane's run is fixed by ``[tool.ditgate]``; anything else that would change what runs or where the
results go is refused (integrity), never silently applied: ``DITGATE_*``, ``PYTEST_ADDOPTS`` and
friends, ``LD_PRELOAD``, and ``PYTHONPATH`` entries that could shadow the project's modules. Every
variable of these families that is set is recorded in the verdict, refused or not.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

#: prefixes whose variables are recorded in the verdict
RECORDED = ("PYTHON", "PYTEST", "DITGATE", "CUDA", "TORCH", "NVIDIA", "CUBLAS", "CUDNN", "OMP_", "MKL", "LD_",
            "TRITON", "INDUCTOR", "HF_", "DIFFUSERS")
#: refused by prefix: the plugin's own switches belong to the judge
REFUSED_PREFIXES = ("DITGATE_",)
#: refused by name: each changes which tests, plugins or code run
REFUSED = ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD", "PYTHONSTARTUP", "PYTHONINSPECT",
           "PYTHONHOME", "PYTHONEXECUTABLE", "LD_PRELOAD", "PYTHONUSERBASE", "PYTHONPYCACHEPREFIX")


def recorded_environment(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(env.items()) if k.startswith(RECORDED)}


def refused_environment(env: Mapping[str, str], root: Path, fixed: list[str]) -> list[str]:
    """One line per variable the judge refuses."""
    problems = [f"environment variable {k}={v!r} changes what runs or where results go (refused in experiment mode)"
                for k, v in sorted(env.items()) if k in REFUSED or k.startswith(REFUSED_PREFIXES)]
    problems += _pythonpath(env.get("PYTHONPATH", ""), root, fixed)
    return problems


def _pythonpath(value: str, root: Path, fixed: list[str]) -> list[str]:
    """PYTHONPATH may name folders outside the project that shadow none of its modules, or fixed folders."""
    problems = []
    names = _top_level(root)
    real_root = root.resolve()
    for entry in filter(None, value.split(os.pathsep)):
        path = Path(entry).resolve()
        try:
            relative = path.relative_to(real_root).as_posix() + "/"
        except ValueError:
            shadowed = sorted(names & _top_level(path))
            if shadowed:
                problems.append(f"PYTHONPATH entry {entry} holds modules named like the project's "
                                f"({', '.join(shadowed)}): refused (they would replace the project's code)")
            continue
        if not any(p.endswith("/") and (p.startswith(relative) or relative.startswith(p)) for p in fixed):
            problems.append(f"PYTHONPATH entry {entry} is inside the project but not a fixed folder: refused")
    return problems


def _top_level(folder: Path) -> set[str]:
    try:
        entries = list(folder.iterdir())
    except OSError:
        return set()
    names = set()
    for path in entries:
        if path.suffix in (".py", ".pyc") or path.name.endswith(".so"):
            names.add(path.name.split(".", 1)[0])
        elif path.is_dir() and not path.name.startswith(".") and path.name not in ("__pycache__",):
            names.add(path.name)
    return names - {"conftest", "setup"}
