"""The roles of the paths ``[tool.ditgate]`` names, and the rules that keep them apart.

A project's files play one role each: the candidate edits the mutable paths; the fixed paths, the golden store,
the fixed-paths lock and the quality contract judge it; the artefact folder holds what runs write. A setting
that gives one path two roles breaks the loop silently: a lock named ``pyproject.toml`` is overwritten with JSON,
a contract inside a mutable path is loosened by the candidate it judges, an artefact folder inside the golden
store is committed by every baseline. :func:`role_problems` names each such overlap, so the settings' check
refuses it at every reader (pytest, the judge, the doctor).

:func:`normalise` writes a path entry the way the lock and the judge's diffs compare paths (relative to the
project root, posix, no ``./``): ``./candidate/`` and an absolute path inside the project are the project-relative
``candidate/``, never a pattern that no changed path matches.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
from pathlib import Path
from typing import Any, Mapping

#: the fixed-paths lock when ``[tool.ditgate] fixed_paths_lock`` names none
DEFAULT_LOCK = "golden/fixed_paths.lock.json"
#: the golden store the judge and its child read (``golden/`` of the project root)
GOLDEN_STORE = "golden"
#: the quality contract when ``[tool.ditgate] quality_contract`` names none
DEFAULT_CONTRACT = "fixtures/quality_contract.toml"
#: fixed by default in every project (a project adds to them, never removes them)
DEFAULT_FIXED = ("**/conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml#tool.ditgate",
                 "pyproject.toml#tool.pytest")
#: files that configure pytest or the project: a lock named so would overwrite them
_CONFIG_NAMES = ("pyproject.toml", "pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg", "conftest.py")
#: keys whose entries :func:`normalise_table` rewrites project-relative
_LIST_KEYS = ("mutable_paths", "fixed_paths")
_STRING_KEYS = ("fixed_paths_lock", "quality_contract", "artefact_dir")


def normalise(root: str | Path, entry: str) -> str:
    """``entry`` (a path, glob, ``file#table`` or ``path::test``) relative to ``root`` in posix form: ``./`` and
    ``..`` segments resolved by text, an absolute path inside the project made relative, a trailing ``/`` kept.
    An entry that leaves the project, or names the root itself, is returned as given (the settings' check
    refuses the first; the second is the caller's to judge)."""
    path, sep, tail = _split(entry)
    raw = os.path.expanduser(path)
    folder = raw.endswith(("/", os.sep))
    if os.path.isabs(raw):
        for folder in (os.path.normpath(str(root)), os.path.normpath(str(Path(root).resolve()))):
            if raw == folder or raw.startswith(folder.rstrip(os.sep) + os.sep):
                raw = os.path.relpath(raw, folder)
                break
        else:
            return entry
    text = raw.replace(os.sep, "/")
    norm = posixpath.normpath(text)
    if norm in (".", "") or norm == ".." or norm.startswith("../"):
        return entry
    return norm + ("/" if folder else "") + sep + tail


def _split(entry: str) -> tuple[str, str, str]:
    """``entry`` as (path, separator, rest): ``file#table`` and ``path::test`` keep their tail."""
    for sep in ("::", "#"):
        if sep in entry:
            path, _, tail = entry.partition(sep)
            return path, sep, tail
    return entry, "", ""


def normalise_table(root: str | Path, table: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the ``[tool.ditgate]`` table ``table`` with its path entries :func:`normalise`-d (values of the
    wrong type are left for the settings' check to name)."""
    out = dict(table)
    for key in _LIST_KEYS:
        value = out.get(key)
        if isinstance(value, list):
            out[key] = [normalise(root, item) if isinstance(item, str) and item.strip() else item for item in value]
    for key in _STRING_KEYS:
        value = out.get(key)
        if isinstance(value, str) and value.strip():
            out[key] = normalise(root, value)
    return out


def _strings(value: Any) -> list[str]:
    return [item for item in value if isinstance(item, str) and item.strip()] if isinstance(value, list) else []


def _inside(path: str, folder: str) -> bool:
    """Whether the relative ``path`` is ``folder`` or lies below it (both posix, no trailing ``/``)."""
    return path == folder or path.startswith(folder + "/")


def _overlaps(path: str, pattern: str) -> bool:
    """Whether the relative folder or file ``path`` and the entry ``pattern`` (folder, file, glob, ``file#table``)
    share a file: one lies inside the other, or ``path`` (or a folder above it) matches the glob, or the glob's
    fixed leading folder lies inside ``path``. ``**/name`` patterns (a file name anywhere) are left out."""
    pattern = _split(pattern)[0].rstrip("/")
    if not pattern or pattern.startswith("**/"):
        return False
    if any(ch in pattern for ch in "*?["):
        parts = path.split("/")
        if any(fnmatch.fnmatch("/".join(parts[:n]), pattern) for n in range(1, len(parts) + 1)):
            return True
        fixed = "/".join(_literal_prefix(pattern.split("/")))
        return bool(fixed) and _inside(fixed, path)
    return _inside(path, pattern) or _inside(pattern, path)


def _literal_prefix(parts: list[str]) -> list[str]:
    out = []
    for part in parts:
        if any(ch in part for ch in "*?["):
            break
        out.append(part)
    return out


def _is_root(root: str | Path, raw: str) -> bool:
    path = Path(os.path.expanduser(raw))
    path = path if path.is_absolute() else Path(root) / path
    return os.path.normpath(str(path)) in (os.path.normpath(str(root)), os.path.normpath(str(Path(root).resolve())))


def _relative(root: str | Path, raw: str) -> str | None:
    """``raw`` (normalised) relative to the project, posix, no trailing ``/``; None when it is outside."""
    norm = normalise(root, raw)
    if os.path.isabs(os.path.expanduser(norm)) or norm == ".." or norm.startswith("../"):
        return None
    return norm.rstrip("/")


def lane_files(table: Mapping[str, Any]) -> list[str]:
    """The test files and timing modules of every declared lane (fixed: they judge the candidate)."""
    lanes = table.get("lanes")
    found: list[str] = []
    for lane in lanes.values() if isinstance(lanes, dict) else ():
        if not isinstance(lane, dict):
            continue
        found += [test.split("::", 1)[0] for test in _strings(lane.get("tests"))]
        timing = lane.get("timing")
        if isinstance(timing, str) and timing.strip():
            found.append(timing)
    return found


def contract_entry(table: Mapping[str, Any]) -> str:
    """The quality contract's path relative to the project, as the fixed-paths lock names it: the configured
    one, else :data:`DEFAULT_CONTRACT` (locked whether or not it exists, so adding one later is a change too)."""
    raw = table.get("quality_contract")
    return raw if isinstance(raw, str) and raw.strip() else DEFAULT_CONTRACT


def role_problems(root: str | Path, given: Mapping[str, Any]) -> list[str]:
    """Why the paths of the ``[tool.ditgate]`` table ``given`` cannot play their roles (empty when they can),
    judged :func:`normalise`-d and named as given:
    the lock names a configuration file, a golden-store file, a non-JSON file or a mutable path; the contract
    lies in a mutable path; the artefact folder is the project root or overlaps the golden store, the lock, a
    fixed path or a mutable path."""
    table = normalise_table(root, given)
    mutable = _strings(table.get("mutable_paths"))
    problems = _lock_problems(root, table, given, mutable)
    raw = given.get("quality_contract")
    contract = _relative(root, raw) if isinstance(raw, str) and raw.strip() else None
    if contract is not None:
        hit = next((entry for entry in mutable if _overlaps(contract, entry)), None)
        if hit:
            problems.append(f"[tool.ditgate] quality_contract names {raw!r}, inside the mutable path {hit!r}: the "
                            "candidate could loosen the contract that judges it; keep it outside the mutable paths "
                            f"(the default is {DEFAULT_CONTRACT})")
    return problems + _artefact_problems(root, table, given, mutable)


def _lock_problems(root: str | Path, table: Mapping[str, Any], given: Mapping[str, Any],
                   mutable: list[str]) -> list[str]:
    raw = given.get("fixed_paths_lock")
    if not isinstance(raw, str) or not raw.strip():
        return []
    lock = _relative(root, raw)
    if lock is None:
        return []  # outside the project: the escape check names it
    where = f"[tool.ditgate] fixed_paths_lock names {raw!r}"
    name = lock.rsplit("/", 1)[-1]
    if name in _CONFIG_NAMES:
        return [f"{where}, a configuration file ditgate would overwrite with the lock's JSON: name a file of its own "
                f"(default {DEFAULT_LOCK})"]
    if not name.endswith(".json"):
        return [f"{where}, which is not a .json file: the lock is JSON that every relock overwrites; name a file of "
                f"its own ending in .json (default {DEFAULT_LOCK})"]
    if _inside(lock, GOLDEN_STORE) and not (lock.count("/") == 1 and name.endswith(".lock.json")):
        return [f"{where}, a file of the golden store ({GOLDEN_STORE}/ holds manifest.json and the goldens): a lock "
                f"there is a direct child named *.lock.json (default {DEFAULT_LOCK})"]
    hit = next((entry for entry in mutable if _overlaps(lock, entry)), None)
    if hit:
        return [f"{where}, inside the mutable path {hit!r}: the candidate could rewrite the lock that judges it"]
    return []


def _artefact_problems(root: str | Path, table: Mapping[str, Any], given: Mapping[str, Any],
                       mutable: list[str]) -> list[str]:
    raw = given.get("artefact_dir")
    if not isinstance(raw, str) or not raw.strip():
        return []
    where = f"[tool.ditgate] artefact_dir names {raw!r}"
    if _is_root(root, raw):
        return [f"{where}, the project root: runs would write their records among the project's files, and a "
                "baseline would commit them; name a folder of its own (default .ditgate)"]
    folder = _relative(root, raw)
    if folder is None:
        return []  # outside the project: allowed (a scratch disk)
    roles = [(GOLDEN_STORE + "/", "the golden store"), (_lock(table), "the fixed-paths lock"),
             (contract_entry(table), "the quality contract")]
    roles += [(entry, f"the fixed path {entry!r}") for entry in [*DEFAULT_FIXED, *_strings(table.get("fixed_paths")),
                                                                 *lane_files(table)]]
    roles += [(entry, f"the mutable path {entry!r}") for entry in mutable]
    for entry, role in roles:
        if _overlaps(folder, entry):
            return [f"{where}, which overlaps {role}: runs write there, and a baseline commits what the judge "
                    "reads; name a folder of its own (default .ditgate)"]
    return []


def _lock(table: Mapping[str, Any]) -> str:
    raw = table.get("fixed_paths_lock")
    return raw if isinstance(raw, str) and raw.strip() else DEFAULT_LOCK


#: the ini option that moves the golden store of plain pytest runs (``--ditgate-golden-dir``)
GOLDEN_DIR_INI = "ditgate_golden_dir"


def golden_dir_problem(root: str | Path, pyproject: Mapping[str, Any], table: Mapping[str, Any]) -> str | None:
    """Why the project's ``[tool.pytest.ini_options] ditgate_golden_dir`` cannot stand (None when it can): the
    project declares lanes, and the judge (``ditgate baseline``/``experiment``) reads, locks and diffs the store
    at ``golden/`` only; a store elsewhere would be frozen by the judge's child and never judged."""
    if not isinstance(table.get("lanes"), dict) or not table["lanes"]:
        return None
    tool = pyproject.get("tool")
    pytest_table = tool.get("pytest") if isinstance(tool, dict) else None
    ini = pytest_table.get("ini_options") if isinstance(pytest_table, dict) else None
    raw = ini.get(GOLDEN_DIR_INI) if isinstance(ini, dict) else None
    if not isinstance(raw, str) or not raw.strip() or normalise(root, raw).rstrip("/") == GOLDEN_STORE:
        return None
    return (f"[tool.pytest.ini_options] {GOLDEN_DIR_INI} = {raw!r}: a project with lanes keeps its golden store "
            f"at {GOLDEN_STORE}/, the one the judge reads and locks; remove the setting (or move the store to "
            f"{GOLDEN_STORE}/)")

