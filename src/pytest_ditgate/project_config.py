"""``[tool.ditgate]`` in the project's ``pyproject.toml``: settings that are project facts, not run options.

Examples: the fixed paths a candidate may never touch, the mutable paths it may edit, the quality
contract's location. Read once per session from the rootdir; a missing file or table is an empty config.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from pytest_ditgate.errors import DitgateUsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def read_pyproject(path: str | Path) -> dict[str, Any]:
    """The whole parsed ``pyproject.toml`` at ``path`` (empty when absent)."""
    path = Path(path)
    if not path.is_file():
        return {}
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise DitgateUsageError(f"{path}: cannot parse ({exc})") from None


def load_project_config(root: str | Path) -> dict[str, Any]:
    """The ``[tool.ditgate]`` table of ``<root>/pyproject.toml`` (empty when absent)."""
    path = Path(root) / "pyproject.toml"
    data = read_pyproject(path)
    table = data.get("tool", {}).get("ditgate", {})
    if not isinstance(table, dict):
        raise DitgateUsageError(f"{path}: [tool.ditgate] must be a table")
    return table


def project_path(root: str | Path, raw: str) -> Path:
    """A path a project setting or option names: ``~`` expanded, a relative one taken from ``root``."""
    path = Path(raw).expanduser()
    return path if path.is_absolute() else Path(root) / path


def string_list(config: dict[str, Any], key: str, *, where: str = "[tool.ditgate]") -> list[str]:
    """A list-of-strings setting, validated (a bare string is a usage error, not a one-item list)."""
    value = config.get(key, [])
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise DitgateUsageError(f"{where} {key} must be a list of strings, got {value!r}")
    return value
