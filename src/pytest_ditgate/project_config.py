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


def missing_folder_problem(path: Path, root: str | Path) -> str | None:
    """Why ditgate must not create the missing folder ``path`` (None when it exists or may be created): it is
    created inside the project (``root``) or under an existing folder, never as a chain of new folders
    elsewhere, where a typo would go unnoticed."""
    if path.exists() or path.parent.is_dir():
        return None
    try:
        inside = path.resolve().is_relative_to(Path(root).resolve())
    except OSError:
        inside = False
    if inside:
        return None
    return (f"{path} does not exist, and neither does its parent folder {path.parent}: ditgate creates a missing "
            "folder inside the project or in an existing folder, never a chain of folders elsewhere (a typo "
            "would go unnoticed); check the path, or create it first")


#: files that make a folder pytest's rootdir (``pytest.ini`` and ``.pytest.ini`` always; the others when they
#: hold a pytest section), in pytest's order of preference within one folder
_INI_FILES = ("pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")


def _has_pytest_section(path: Path) -> bool:
    if path.name in ("pytest.ini", ".pytest.ini"):
        return True
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    if path.name == "pyproject.toml":
        try:
            tool = tomllib.loads(text).get("tool", {})
        except tomllib.TOMLDecodeError:
            return False
        return isinstance(tool, dict) and "pytest" in tool
    section = "[pytest]" if path.name == "tox.ini" else "[tool:pytest]"
    return any(line.strip() == section for line in text.splitlines())


def find_project_root(start: str | Path | None = None) -> Path:
    """The project root the ``ditgate`` commands work from, found as pytest finds its rootdir from ``start``
    (default: the current folder): the nearest folder, ``start`` or above, with a ``pytest.ini``, or a
    ``pyproject.toml``/``tox.ini``/``setup.cfg`` holding a pytest section; else the
    nearest with a ``pyproject.toml``, then with a ``setup.py``; else ``start`` itself. So ``ditgate report``
    run from ``tests/`` reads the same ``.ditgate`` that ``pytest`` there writes."""
    here = Path(start if start is not None else Path.cwd()).resolve()
    folders = [here, *here.parents]
    for folder in folders:
        if any((folder / name).is_file() and _has_pytest_section(folder / name) for name in _INI_FILES):
            return folder
    for marker in ("pyproject.toml", "setup.py"):
        for folder in folders:
            if (folder / marker).is_file():
                return folder
    return here


def string_list(config: dict[str, Any], key: str, *, where: str = "[tool.ditgate]") -> list[str]:
    """A list-of-strings setting, validated (a bare string is a usage error, not a one-item list)."""
    value = config.get(key, [])
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise DitgateUsageError(f"{where} {key} must be a list of strings, got {value!r}")
    return value
