"""The one resolver of the artefact folder (ledger, verdicts, lane histories), for pytest, the ``ditgate``
commands, the doctor and the judge alike.

Order: an explicit option (``--ditgate-dir``, ``ditgate ... --dir``), then ``$DITGATE_DIR``, then
``[tool.ditgate] artefact_dir``, then ``<root>/.ditgate``; relative paths are taken from the root. pytest's
root is its rootdir; a command's is the project root, found as pytest finds its rootdir
(:func:`~pytest_ditgate.project_config.find_project_root`), so a command run from a subfolder reads what
``pytest --ditgate`` wrote.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from pytest_ditgate.errors import DitgateUsageError
from pytest_ditgate.project_config import find_project_root, load_project_config, project_path

ENV = "DITGATE_DIR"
DEFAULT = ".ditgate"


def resolve_artefact_dir(root: str | Path, option: str | None = None, *, env: Mapping[str, str] | None = None,
                         table: Mapping[str, Any] | None = None) -> Path:
    """Where this run's artefacts go (absolute)."""
    root = Path(root)
    env = os.environ if env is None else env
    if table is None:
        try:
            table = load_project_config(root)
        except DitgateUsageError:
            table = {}
    configured = table.get("artefact_dir")
    raw = option or env.get(ENV) or (configured if isinstance(configured, str) else None) or DEFAULT
    return project_path(root, raw)


def command_artefact_dir(option: str | None = None) -> Path:
    """The folder a ``ditgate`` command reads: ``option`` (its ``--dir``, taken from the current folder), else
    what pytest run at the project root uses. A ``[tool.ditgate]`` table that fails its checks raises
    DitgateUsageError (the command's exit 4), as it fails ``pytest --ditgate``."""
    explicit = str(Path(option).expanduser().absolute()) if option else None
    root = find_project_root()
    return resolve_artefact_dir(root, explicit, table=load_project_config(root))  # a bad [tool.ditgate]: exit 4


def named_by(option: str | None, otherwise: str, *, env: Mapping[str, str] | None = None) -> str:
    """Which setting named the folder, for a message: ``option`` (the option as the user gave it) when given,
    else ``$DITGATE_DIR`` when set, else ``otherwise``."""
    env = os.environ if env is None else env
    return option or (f"{ENV}={env[ENV]}" if env.get(ENV) else otherwise)
