"""``[tool.ditgate]`` in the project's ``pyproject.toml``: settings that are project facts, not run options.

Examples: the fixed paths a candidate may never touch, the mutable paths it may edit, the quality
contract's location. Read once per session from the rootdir; a missing file or table is an empty config.
Every read checks the table against :data:`PROJECT_KEYS` (and each lane against :data:`LANE_KEYS`): an unknown
key (``fixed_path``, with a did-you-mean) or a value of the wrong type (``artefact_dir = 5``, ``lanes = "fwd"``)
is a usage error naming it, never a setting silently ignored (a misspelt ``fixed_paths`` would lock nothing).
"""

from __future__ import annotations

import math
import os
import re
import sys
from pathlib import Path
from typing import Any

from pytest_ditgate.arguments import did_you_mean
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


#: a noise floor (``min_improvement``) is a fraction: 0.02 asks for 2 %; half or more would keep nothing real
MAX_NOISE_FLOOR = 0.5


def noise_floor(value: Any) -> float:
    """``value`` as a lane's noise floor: a finite number in [0, 0.5); ValueError otherwise, saying that ``2`` is
    not 2 % (write 0.02)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and 0.0 <= value < MAX_NOISE_FLOOR:
        return float(value)
    hint = f" (a fraction: write {value / 100:g} for {value:g} %)" if ok and 1 <= value < 100 else ""
    raise ValueError(f"must be a number in [0, {MAX_NOISE_FLOOR:g}), got {value!r}{hint}")


#: what each key of ``[tool.ditgate]`` holds: ``paths``/``strings`` a list of non-empty strings, ``string`` a
#: non-empty string, ``number`` a finite number, ``lanes`` a table of lane tables
PROJECT_KEYS: dict[str, str] = {
    "mutable_paths": "paths", "fixed_paths": "paths", "fixed_paths_lock": "string", "artefact_dir": "string",
    "quality_contract": "string", "classifier": "factory", "lpips_weights": "string", "clip_weights": "string",
    "clip_model": "string", "packages": "distributions", "lanes": "lanes",
}
#: the keys of a ``[tool.ditgate.lanes.<name>]`` table (their values are checked by ``verdict/lane.py``)
LANE_KEYS: dict[str, str] = {"tests": "paths", "class": "string", "objective": "string", "required": "strings",
                             "min_improvement": "noise floor", "timing": "string"}
_KINDS = {"paths": "a list of non-empty strings", "strings": "a list of non-empty strings",
          "distributions": "a list of distribution names as pip has them, each with an optional version spec "
                           "('liger-kernel', 'triton>=3.0')",
          "string": "a non-empty string", "lanes": "a table of lane tables",
          "factory": "a factory written 'package.module:callable'"}
#: a factory a setting names, imported when first used: ``package.module:callable``
_FACTORY = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")
#: a distribution name (PEP 508) with an optional version spec, as ``[tool.ditgate] packages`` lists them
_DISTRIBUTION = re.compile(r"^\s*[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?\s*(?:[<>=!~][<>=!~0-9A-Za-z.*+,\s-]*)?$")
#: a lane's name: it names the lane's history file and its git ref (``refs/ditgate/lanes/<name>``)
_LANE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]+)*$")
#: the settings that name files of the project (the lock and the judge's diffs see only the project's files)
_PROJECT_FILE_KEYS = ("mutable_paths", "fixed_paths", "fixed_paths_lock", "quality_contract")
_LANE_FILE_KEYS = ("tests", "timing")


def _kind_problem(kind: str, value: Any) -> str | None:
    """Why ``value`` is not of ``kind`` (None when it is)."""
    if kind == "noise floor":
        try:
            noise_floor(value)
        except ValueError as exc:
            return str(exc)
        return None
    if kind in ("paths", "strings", "distributions"):
        fits = isinstance(value, list) and all(isinstance(item, str) and item.strip() for item in value)
        if fits and kind == "distributions":
            fits = all(_DISTRIBUTION.match(item) for item in value)
    elif kind == "string":
        fits = isinstance(value, str) and bool(value.strip())
    elif kind == "factory":
        fits = isinstance(value, str) and bool(_FACTORY.match(value.strip()))
    else:
        fits = isinstance(value, dict) and all(isinstance(lane, dict) for lane in value.values())
    return None if fits else f"must be {_KINDS[kind]}, got {value!r}"


def _table_problems(table: dict[str, Any], schema: dict[str, str], where: str) -> list[str]:
    problems = []
    for key, value in table.items():
        if key not in schema:
            problems.append(f"{where}: unknown key {key!r}{did_you_mean(key, schema)} (known: {', '.join(schema)})")
            continue
        problem = _kind_problem(schema[key], value)
        if problem:
            problems.append(f"{where} {key} {problem}")
    return problems


def lane_name_problem(name: str, others: list[str]) -> str | None:
    """Why ``name`` cannot name a lane (None when it can): it names the lane's history file and git ref, so it is
    letters, digits, ``-``, ``_`` and inner dots (no ``/``, space, ``..``, nor a ``.lock`` ending git refuses), and
    two lanes may not differ only in case (their files would be one on a case-insensitive disk)."""
    if not _LANE_NAME.match(name) or name.endswith(".lock"):
        return (f"[tool.ditgate.lanes] lane name {name!r} is not a valid lane name: use letters, digits, '-', '_' and "
                "inner dots (it names the lane's history file and git ref), e.g. 'fwd' or 'dit-xl'")
    twins = [other for other in others if other != name and other.lower() == name.lower()]
    if twins:
        return (f"[tool.ditgate.lanes] lanes {name!r} and {twins[0]!r} differ only in case: their histories would be "
                "one file on a case-insensitive disk; rename one")
    return None


def _escapes(root: str | Path, entry: str) -> bool:
    """Whether the path setting ``entry`` (a path, a glob, ``path::test`` or ``file#table``) leads out of
    ``root``, by its text (``..``, an absolute path elsewhere): links inside the project are the project's own."""
    raw = os.path.expanduser(entry.split("::", 1)[0].split("#", 1)[0])
    if not raw:
        return False
    folders = {os.path.normpath(str(root)), os.path.normpath(str(Path(root).resolve()))}
    target = os.path.normpath(os.path.join(str(root), raw))
    if not os.path.isabs(raw):
        return target == os.pardir or os.path.normpath(raw).split(os.sep, 1)[0] == os.pardir
    return not any(target == folder or target.startswith(folder.rstrip(os.sep) + os.sep) for folder in folders)


def _escape_problems(root: str | Path, table: dict[str, Any], keys: tuple[str, ...], where: str) -> list[str]:
    problems = []
    for key in keys:
        value = table.get(key)
        for entry in [value] if isinstance(value, str) else value if isinstance(value, list) else ():
            if isinstance(entry, str) and _escapes(root, entry):
                problems.append(f"{where} {key} names {entry!r}, outside the project {root}: the lock and the judge see "
                                "only the project's files; name a path inside it (relative to the project root)")
    return problems


def project_problems(table: dict[str, Any], root: str | Path | None = None) -> list[str]:
    """Every key of the ``[tool.ditgate]`` table ``table`` that is unknown or of the wrong type (lanes too), every
    lane name that cannot name a lane, and (given the project's ``root``) every file setting leading out of it
    and every path given a role it cannot play (:func:`~pytest_ditgate.project_paths.role_problems`)."""
    from pytest_ditgate.project_paths import role_problems

    problems = _table_problems(table, PROJECT_KEYS, "[tool.ditgate]")
    if root is not None:
        problems += _escape_problems(root, table, _PROJECT_FILE_KEYS, "[tool.ditgate]")
        problems += role_problems(root, table)
    lanes = table.get("lanes")
    if isinstance(lanes, dict):
        for name, lane in lanes.items():
            problem = lane_name_problem(name, list(lanes))
            if problem:
                problems.append(problem)
            if isinstance(lane, dict):
                problems += _table_problems(lane, LANE_KEYS, f"[tool.ditgate.lanes.{name}]")
                if root is not None:
                    problems += _escape_problems(root, lane, _LANE_FILE_KEYS, f"[tool.ditgate.lanes.{name}]")
    return problems


def load_project_config(root: str | Path) -> dict[str, Any]:
    """The ``[tool.ditgate]`` table of ``<root>/pyproject.toml`` (empty when absent), checked against
    :data:`PROJECT_KEYS`: a DitgateUsageError names every unknown key and wrong type, in one line. Its path
    entries come back project-relative (``./candidate/`` is ``candidate/``: :mod:`pytest_ditgate.project_paths`)."""
    from pytest_ditgate.project_paths import golden_dir_problem, normalise_table

    path = Path(root) / "pyproject.toml"
    data = read_pyproject(path)
    tool = data.get("tool", {})
    table = tool.get("ditgate", {}) if isinstance(tool, dict) else {}
    if not isinstance(table, dict):
        raise DitgateUsageError(f"{path}: [tool.ditgate] must be a table, got {table!r}")
    problems = project_problems(table, root)
    golden = golden_dir_problem(root, data, table)
    problems += [golden] if golden else []
    if problems:
        raise DitgateUsageError(f"{path}: " + "; ".join(problems))
    return normalise_table(root, table)


def missing_paths(root: str | Path, paths: list[str], setting: str) -> list[str]:
    """A problem for each entry of ``paths`` (a setting's files and folders, relative to ``root``) that does not
    exist: a typo'd ``fixed_paths`` entry would lock nothing, a lane's test that is not there runs nothing. A
    glob pattern must match something (``**/`` patterns, which search the whole tree, are not looked up);
    pyproject tables (``pyproject.toml#tool.x``) are not looked up; ``path::test`` node ids are looked up by
    their file."""
    problems = []
    for entry in paths:
        if "#" in entry or entry.startswith("**/"):
            continue
        if any(ch in entry for ch in "*?["):
            try:
                found = next(iter(Path(root).glob(entry)), None)
            except (ValueError, OSError):  # a pattern pathlib refuses ("/abs", "a/**b")
                found = None
            if found is None:
                problems.append(f"{setting} names {entry!r}, a pattern that matches nothing under {root}")
            continue
        relative = entry.split("::", 1)[0]
        path = project_path(root, relative)
        if path.exists():
            continue
        parent = path.parent
        siblings = [p.name + ("/" if p.is_dir() else "") for p in parent.iterdir()] if parent.is_dir() else []
        folder = relative.rstrip("/").rpartition("/")[0]
        hint = did_you_mean(path.name + ("/" if relative.endswith("/") else ""), siblings,
                            prefix=f"{folder}/" if folder else "")
        problems.append(f"{setting} names {entry!r}, which does not exist under {root}{hint}")
    return problems


def timing_module_problem(root: str | Path, raw: str, where: str) -> str | None:
    """Why the lane's timing module ``raw`` cannot give the judge its regions, read without running it (None when
    it may): it does not parse, or it never binds ``REGIONS`` at its top level (an assignment or an import; a
    star import is taken on trust). A module that raises when imported is found only when the judge imports it."""
    import ast

    path = project_path(root, raw)
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except OSError:
        return None  # missing: missing_paths says so
    except (SyntaxError, ValueError) as exc:
        line = getattr(exc, "lineno", None)
        return f"{where} names {raw!r}, which is not valid Python ({exc.msg if isinstance(exc, SyntaxError) else exc}" \
               + (f", line {line})" if line else ")") + ": fix it before the judge imports it"
    for node in tree.body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(alias.name == "*" or (alias.asname or alias.name) == "REGIONS" for alias in node.names):
                return None
        if any(isinstance(t, ast.Name) and t.id == "REGIONS" for t in targets):
            return None
    return (f"{where} names {raw!r}, which declares no REGIONS (a list of pytest_ditgate.timed_region.TimedRegion, "
            "the regions the judge times)")


def project_path(root: str | Path, raw: str) -> Path:
    """A path a project setting or option names: ``~`` expanded, a relative one taken from ``root``."""
    path = Path(raw).expanduser()
    return path if path.is_absolute() else Path(root) / path


def _nearest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (the filesystem root at worst)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def missing_folder_problem(path: Path, root: str | Path) -> str | None:
    """Why ditgate must not create the missing folder ``path`` (None when it exists or may be created): it is
    created inside the project (``root``) or under an existing folder, never as a chain of new folders
    elsewhere, where a typo would go unnoticed; and never under a file (``test_x.py/out``), where no folder can be."""
    if path.exists():
        return None
    ancestor = _nearest_existing(path.parent)
    if ancestor.exists() and not ancestor.is_dir():
        return f"{ancestor} is a file, so no folder {path} can be made under it; check the path"
    if path.parent.is_dir():
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


def output_file_problem(path: Path, root: str | Path, *, kind: str = "file") -> str | None:
    """Why ditgate must not write the file ``path`` that an option names (None when it may): it is a folder; a
    part of its folder is a file or not writable; or its folder is missing outside the project (``root``).
    Missing folders are created inside the project only: elsewhere, even at the filesystem root, a typo would
    make a chain of new folders and leave the file where nobody looks. ``kind`` names the file in a message."""
    import os

    if path.is_dir():
        return f"is a folder; give the path of a {kind} to write"
    ancestor = _nearest_existing(path.parent)
    if not ancestor.is_dir():
        return f"{ancestor} is not a folder"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"{ancestor} is not writable"
    if ancestor == path.parent:
        return None
    try:
        inside = path.parent.resolve().is_relative_to(Path(root).resolve())
    except OSError:
        inside = False
    if inside:
        return None
    return (f"its folder {path.parent} does not exist; ditgate creates missing folders for a file only inside the "
            f"project ({root}), never a chain of folders elsewhere (a typo would go unnoticed): check the path, or "
            "create the folder first")


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
