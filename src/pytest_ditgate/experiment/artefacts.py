"""The one resolver of the artefact folder (ledger, verdicts, lane histories), for pytest and the CLI alike.

Order: an explicit option (``--ditgate-dir``, ``ditgate ... --dir``), then ``$DITGATE_DIR``, then
``[tool.ditgate] artefact_dir``, then ``<root>/.ditgate``; relative paths are taken from the root.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from pytest_ditgate.errors import DitgateUsageError
from pytest_ditgate.project_config import load_project_config, project_path

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
