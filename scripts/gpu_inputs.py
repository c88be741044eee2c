"""What a unit of the GPU check depends on: the project files its run read, from a recording, closed over the
imports that a run may use without reading a file again.

A recorded run (``read_recorder/gpucheck_recorder.py`` in every process) says, per unit, which files were
opened for reading, whose code ran, which trees were copied and which modules or distributions were looked up.
:func:`unit_inputs` turns that into project-relative paths:

- a read in a copy of the project (``shutil.copytree``) counts as a read of the original;
- a ``.pyc`` counts as its source;
- what the run read outside any unit (pytest's start, the plugin, the conftests) counts for every unit of it;
- where the interpreter could not trace code (no ``sys.monitoring`` before Python 3.12), a unit also gets
  everything its process read before it ended: a module imported by an earlier unit is not read again;
- the static part (:class:`ImportGraph`): every module a read file imports, at module level or inside a
  function, or names as a string (a dotted name anywhere; a single identifier only in a file that imports by
  name, ``importlib.import_module("kernels")``), with the module-level imports of those, transitively. A
  module imported earlier in the process is not read again when a later unit uses it: this closure covers
  what the unit can reach through what it read. Lazy-export tables (``{"name":
  "pkg.module"}``) are followed only for the names a file imports, so a run that never asks for
  ``pytest_ditgate.check_kernel`` is not keyed on ``correctness/checks.py``.

Standard library only.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

#: folders and files that are never inputs (caches, environments, artefacts, documentation, records)
SKIPPED_PARTS = {"__pycache__", ".ditgate", ".pytest_cache", ".hypothesis", "build", "dist", ".tox", ".git", ".venv",
                 ".whl", ".gl", ".stage", "node_modules"}
IGNORED = ("*.md", "docs/*", "benchmarks/results/*", "*.egg-info/*", "*.lock", "*.pyc", ".gitignore", "*/.gitignore")
#: where modules are looked up, besides the importing file's own folder (src layout first)
SEARCH_ROOTS = ("src", "", "scripts", "benchmarks")
PYC = re.compile(r"^(?P<name>[^.]+)\.[^/]*\.pyc$")
DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)
C_SUFFIXES = (".cu", ".cuh", ".h", ".hpp", ".cpp", ".cc", ".c")
#: calls that import a module named by a string: a file making one may name a module as a bare identifier
#: (``import_module("kernels")``); elsewhere such a string is a word ("torch", "kernels", "auto"), not an import
IMPORTS_BY_NAME = {"import_module", "__import__", "find_spec", "importorskip"}


def ignored(rel: str) -> bool:
    """Paths whose contents no GPU result depends on by policy (docs, records, caches)."""
    parts = rel.split("/")
    return bool(SKIPPED_PARTS.intersection(parts)) or any(fnmatch.fnmatch(rel, pattern) for pattern in IGNORED)


# -- the recording -------------------------------------------------------------------------------------------

@dataclass
class Process:
    pid: int
    inherited: str
    monitored: bool
    #: a process of a nested recording: everything it did counts for ``inherited``, whatever unit it noted
    fixed: bool = False
    #: (kind, unit, payload) in the order written
    events: list[tuple[str, str, str]] = field(default_factory=list)


@dataclass
class Recording:
    processes: list[Process]
    copies: list[tuple[str, str]]

    @classmethod
    def load(cls, folder: Path, unit: str | None = None, _seen: set[str] | None = None) -> "Recording":
        """The recording in ``folder``, and the nested recordings it names (each process of those counts for
        the unit that started it, ``unit``)."""
        processes, copies = [], []
        seen = _seen if _seen is not None else set()
        seen.add(os.path.realpath(folder))
        for path in sorted(Path(folder).glob("*.jsonl")):
            current: Process | None = None
            for line in path.read_text(errors="replace").splitlines():
                try:
                    item = json.loads(line)
                except ValueError:
                    continue  # a line cut short by a killed process
                kind = item.get("k")
                if kind == "proc":
                    current = Process(int(item.get("pid", 0)), unit if unit is not None else item.get("unit", ""),
                                      False, fixed=unit is not None)
                    processes.append(current)
                    continue
                if current is None:
                    continue
                if kind == "monitor":
                    current.monitored = True
                elif kind == "copy":
                    copies.append((item["src"], item["dst"]))
                elif kind == "unit":
                    current.events.append((kind, item.get("u", ""), item.get("u", "")))
                elif kind == "exec":
                    current.events.append((kind, item.get("u", ""), f"{item.get('p', '')}\0{item.get('l', 0)}"))
                elif kind in ("open", "mod"):
                    payload = item.get("p") or item.get("n") or ""
                    current.events.append((kind, item.get("u", ""), payload))
                elif kind == "blind":
                    current.events.append((kind, item.get("u", ""), " ".join(map(str, item.get("argv") or []))))
                elif kind == "uses":
                    current.events.append((kind, item.get("u", ""), item.get("f", "")))
                elif kind == "nested":
                    outer = current.inherited if current.fixed else item.get("u", "")
                    inner = item.get("dir", "")
                    if os.path.realpath(inner) in seen:
                        continue
                    if not Path(inner).is_dir():
                        current.events.append(("blind", outer, f"a nested recording that is gone: {inner}"))
                        continue
                    nested = cls.load(Path(inner), outer, seen)
                    processes += nested.processes
                    copies += nested.copies
        return cls(processes, copies)


@dataclass
class UnitReads:
    """What one unit read: project files (relative paths), modules or distributions looked up by name, and the
    Python processes it started without the recorder (what those read is unknown)."""

    files: set[str] = field(default_factory=set)
    modules: set[str] = field(default_factory=set)
    blind: list[str] = field(default_factory=list)
    #: fixtures wider than a test that the unit's tests used (their set-up's reads are added to the unit's)
    fixtures: set[str] = field(default_factory=set)
    #: (file, first line of a code object) of every function that ran, where code was traced
    functions: set[tuple[str, int]] = field(default_factory=set)
    #: some of the unit's reads came from a process whose code was not traced (so every function counts)
    untraced: bool = False

    def add(self, other: "UnitReads") -> None:
        self.files |= other.files
        self.modules |= other.modules
        self.functions |= other.functions
        self.untraced |= other.untraced
        self.blind += [b for b in other.blind if b not in self.blind]


def _aliases(copies: list[tuple[str, str]], root: Path) -> list[tuple[str, str]]:
    """(copy folder, original folder) pairs for copies of the project or of folders inside it, copies of
    copies resolved to the original; longest copy folder first."""
    real_root = os.path.realpath(root)
    known: list[tuple[str, str]] = []
    for _ in range(4):  # copies of copies
        for src, dst in copies:
            src_real, dst_real = os.path.realpath(src), os.path.realpath(dst)
            original = _original(src_real, known, real_root)
            if original is not None and (dst_real, original) not in known:
                known.append((dst_real, original))
    return sorted(known, key=lambda pair: -len(pair[0]))


def _original(path: str, aliases: list[tuple[str, str]], real_root: str) -> str | None:
    if path == real_root or path.startswith(real_root + os.sep):
        return path
    for copy, original in aliases:
        if path == copy or path.startswith(copy + os.sep):
            return original + path[len(copy):]
    return None


def relative(path: str, root: Path, aliases: list[tuple[str, str]]) -> str | None:
    """``path`` as a project-relative path (a ``.pyc`` as its source, a copy as its original), or None."""
    real_root = os.path.realpath(root)
    original = _original(os.path.realpath(path), aliases, real_root)
    if original is None:
        return None
    rel = os.path.relpath(original, real_root).replace(os.sep, "/")
    folder, _, name = rel.rpartition("/")
    if folder.endswith("__pycache__") and name.endswith(".pyc"):
        match = PYC.match(name)
        if match:
            folder = folder[: -len("__pycache__")].rstrip("/")
            rel = f"{folder}/{match['name']}.py" if folder else f"{match['name']}.py"
    return None if rel.startswith("..") or ignored(rel) else rel


def unit_reads(recording: Recording, root: Path, whole: str | None = None) -> dict[str, UnitReads]:
    """Reads per unit (a project-relative test file), or every read under the one unit ``whole`` (a stage that
    is one unit: a benchmark, the loop). Reads outside any unit count for every unit of the run."""
    aliases = _aliases(recording.copies, root)
    units: dict[str, UnitReads] = {}
    fixtures: dict[str, UnitReads] = {}
    common = UnitReads()

    def bucket(unit: str) -> UnitReads:
        if whole is not None:
            return units.setdefault(whole, UnitReads())
        if not unit:
            return common
        if unit.startswith("fixture:"):
            return fixtures.setdefault(unit, UnitReads())
        rel = relative(unit, root, aliases) or unit
        return units.setdefault(rel, UnitReads())

    for process in recording.processes:
        prefix = UnitReads()  # everything this process read so far: a unit's share where code is not traced
        for kind, unit, payload in process.events:
            if kind == "unit":
                if payload and whole is None and not process.monitored and not process.fixed:
                    target = bucket(payload)
                    target.files |= prefix.files
                    target.modules |= prefix.modules
                    target.untraced = True
                continue
            target = bucket(process.inherited if process.fixed else (unit or process.inherited))
            if kind == "blind":
                target.blind.append(payload)
                continue
            if kind == "uses":
                target.fixtures.add(payload)
                continue
            if kind == "mod":
                target.modules.add(payload)
                prefix.modules.add(payload)
                continue
            if not process.monitored:
                target.untraced = True
            line = 0
            if kind == "exec":
                payload, _, number = payload.partition("\0")
                line = int(number or 0)
            rel = relative(payload, root, aliases)
            if rel is not None and not (root / rel).is_dir():
                target.files.add(rel)
                prefix.files.add(rel)
                if kind == "exec":
                    target.functions.add((rel, line))
    for reads in units.values():
        for fixture in reads.fixtures:
            reads.add(fixtures.get(fixture, UnitReads()))
        reads.add(common)
    if whole is not None and whole not in units:
        units[whole] = common
    return units


# -- the static part: what a read file's imports can reach --------------------------------------------------

@dataclass
class Scope:
    """What one scope of a module (the module itself, or a function) imports or names."""

    imports: set[str] = field(default_factory=set)  # module names
    strings: set[str] = field(default_factory=set)  # dotted names given as strings
    bare: set[str] = field(default_factory=set)  # single identifiers given as strings ("kernels", "auto")
    names: set[tuple[str, str]] = field(default_factory=set)  # (module, name) of ``from module import name``


@dataclass
class FileImports:
    """A file's imports: its module scope (run whenever it is imported) and each function's (run only when the
    function runs), keyed by the first line of the function's code object (its first decorator's line, or its
    ``def``); its lazy-export tables; and, for C/C++, its includes."""

    module: Scope = field(default_factory=Scope)
    functions: dict[int, Scope] = field(default_factory=dict)
    tables: dict[str, set[str]] = field(default_factory=dict)  # lazy-export tables: name -> modules
    includes: set[str] = field(default_factory=set)  # C/C++ ``#include "..."``
    #: the file imports by name somewhere (``importlib.import_module``, ``__import__``, ``find_spec``,
    #: ``importorskip``, ``pytest_plugins``): only then is a single identifier in a string a module's name
    imports_by_name: bool = False

    def scopes(self, lines: set[int] | None) -> list[Scope]:
        """The module scope and the functions that ran (all of them when ``lines`` is None: not traced)."""
        if lines is None:
            return [self.module, *self.functions.values()]
        return [self.module, *(scope for line, scope in self.functions.items() if line in lines)]


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _call_name(func: ast.AST) -> str:
    """The called name of ``f(...)`` or ``a.b.f(...)``."""
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def parse_python(source: str, package: str) -> FileImports:
    """The imports of one module's source; ``package`` resolves relative imports (``a.b`` for ``a/b/c.py``)."""
    found = FileImports()
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return found
    table_values: set[int] = set()
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict):
            keys, values = node.value.keys, node.value.values
            if keys and all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in keys) and \
                    all(isinstance(v, ast.Constant) and isinstance(v.value, str) and DOTTED.match(v.value) for v in values):
                for key, value in zip(keys, values):
                    found.tables.setdefault(key.value, set()).add(value.value)
                    table_values.add(id(value))

    def absolute(module: str | None, level: int) -> str:
        if not level:
            return module or ""
        base = package.split(".") if package else []
        base = base[: len(base) - (level - 1)] if level > 1 else base
        return ".".join([*base, module] if module else base)

    def visit(node: ast.AST, scope: Scope) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for other in child.orelse:
                    visit_one(other, scope)
                continue
            visit_one(child, scope)

    def visit_one(child: ast.AST, scope: Scope) -> None:
        if isinstance(child, ast.Import):
            scope.imports.update(alias.name for alias in child.names)
        elif isinstance(child, ast.ImportFrom):
            module = absolute(child.module, child.level)
            if module:
                scope.imports.add(module)
            for alias in child.names:
                if alias.name != "*":
                    scope.imports.add(f"{module}.{alias.name}" if module else alias.name)
                    scope.names.add((module, alias.name))
        elif isinstance(child, ast.Constant) and isinstance(child.value, str) and id(child) not in table_values:
            if DOTTED.match(child.value):
                scope.strings.add(child.value)
            elif child.value.isidentifier():
                scope.bare.add(child.value)
        elif isinstance(child, ast.Call) and _call_name(child.func) in IMPORTS_BY_NAME:
            found.imports_by_name = True
        elif isinstance(child, (ast.Assign, ast.AnnAssign)) and any(
                isinstance(t, ast.Name) and t.id == "pytest_plugins"
                for t in (child.targets if isinstance(child, ast.Assign) else [child.target])):
            found.imports_by_name = True
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            decorators = getattr(child, "decorator_list", [])
            for decorator in decorators:  # evaluated where the function is defined
                visit_one(decorator, scope)
            inner = Scope()
            for line in {child.lineno, *(d.lineno for d in decorators)}:
                found.functions[line] = inner
            for part in ast.iter_child_nodes(child):
                if part not in decorators:
                    if isinstance(part, ast.If) and _type_checking(part):
                        continue
                    visit_one(part, inner)
            return
        visit(child, scope)

    visit(tree, found.module)
    return found


class ImportGraph:
    """Module resolution and parsed imports of a project tree (each file parsed once)."""

    def __init__(self, root: Path, search: Iterable[str] = SEARCH_ROOTS) -> None:
        self.root = Path(root)
        self.search = [self.root / s if s else self.root for s in search]
        self._parsed: dict[Path, FileImports] = {}
        self._resolved: dict[tuple[str, Path], Path | None] = {}

    def _candidate(self, base: Path, name: str) -> Path | None:
        path = base.joinpath(*name.split("."))
        for option in (path.with_suffix(".py") if path.name else None, path / "__init__.py"):
            if option is not None and option.is_file():
                return option
        return None

    def module_file(self, name: str, near: Path | None = None) -> Path | None:
        """The project file of module ``name``, looked up beside ``near`` first, then in the search roots."""
        key = (name, near or self.root)
        if key not in self._resolved:
            bases = ([near] if near is not None else []) + self.search
            self._resolved[key] = next((found for base in bases if (found := self._candidate(base, name))), None)
        return self._resolved[key]

    def package_of(self, path: Path) -> str:
        """The dotted package a file belongs to (for relative imports), from the nearest search root."""
        for base in sorted(self.search, key=lambda b: -len(b.parts)):
            try:
                rel = path.parent.relative_to(base)
            except ValueError:
                continue
            return ".".join(rel.parts)
        return ""

    def imports(self, path: Path) -> FileImports:
        if path not in self._parsed:
            try:
                text = path.read_text(errors="replace")
            except OSError:
                self._parsed[path] = FileImports()
                return self._parsed[path]
            if path.suffix == ".py":
                self._parsed[path] = parse_python(text, self.package_of(path))
            elif path.suffix in C_SUFFIXES:
                self._parsed[path] = FileImports(includes=set(INCLUDE.findall(text)))
            else:
                self._parsed[path] = FileImports()
        return self._parsed[path]

    def _modules(self, name: str, near: Path) -> list[Path]:
        """The files importing ``name`` executes: each parent package's ``__init__`` and the module itself."""
        parts = name.split(".")
        found = []
        for end in range(1, len(parts) + 1):
            file = self.module_file(".".join(parts[:end]), near)
            if file is not None:
                found.append(file)
        return found

    def reached(self, path: Path, lines: set[int] | None = None) -> set[Path]:
        """One step from a file that was read or ran: every module its module scope, and each of its functions
        that ran (``lines``: their code objects' first lines; None: all of them), imports or names as a string,
        the modules its ``from package import name`` reach through a lazy-export table, and its includes."""
        found = self.imports(path)
        near = path.parent
        out: set[Path] = set()
        for scope in found.scopes(lines):
            for name in scope.imports | scope.strings | (scope.bare if found.imports_by_name else set()):
                out.update(self._modules(name, near))
            for module, name in scope.names:
                package = self.module_file(module, near)
                if package is not None:
                    for target in self.imports(package).tables.get(name, ()):
                        out.update(self._modules(target, package.parent))
        for include in found.includes:
            candidate = (near / include).resolve()
            if candidate.is_file():
                out.add(candidate)
        return out

    def eager_closure(self, paths: Iterable[Path]) -> set[Path]:
        """``paths`` and everything their module-level imports (and their packages' ``__init__``) execute,
        transitively; C includes likewise."""
        todo, seen = list(paths), set()
        while todo:
            path = todo.pop()
            if path in seen:
                continue
            seen.add(path)
            found = self.imports(path)
            for name in found.module.imports:
                todo.extend(self._modules(name, path.parent))
            for include in found.includes:
                candidate = (path.parent / include).resolve()
                if candidate.is_file():
                    todo.append(candidate)
            init = path.parent / "__init__.py"
            if path.suffix == ".py" and init != path and init.is_file() and self.package_of(path):
                todo.append(init)
        return seen

    def inputs(self, seeds: Iterable[str], ran: dict[str, set[int]] | None = None) -> set[str]:
        """The project-relative files ``seeds`` (files read or run) depend on: the seeds, what they reach in one
        step, and the module-level imports of all of those. ``ran``: for a traced run, the functions that ran
        in each file (the first lines of their code objects): only their function-level imports count; None:
        not traced, every function's count."""
        root = self.root.resolve()
        seeds = list(seeds)
        start = [self.root / rel for rel in seeds]
        reached = set(start)
        for rel, path in zip(seeds, start):
            if path.is_file():
                reached |= self.reached(path, None if ran is None else ran.get(rel, set()))
        out = set()
        for path in self.eager_closure(p for p in reached if p.is_file()) | set(start):
            try:
                rel = path.resolve().relative_to(root).as_posix()
            except ValueError:
                continue
            if not ignored(rel):
                out.add(rel)
        return out


def conftests(test_file: str, root: Path) -> list[str]:
    """The ``conftest.py`` files pytest loads for ``test_file``: from the root down to its folder."""
    parts = test_file.split("/")[:-1]
    found = []
    for end in range(len(parts) + 1):
        rel = "/".join([*parts[:end], "conftest.py"])
        if (root / rel).is_file():
            found.append(rel)
    return found


def unit_inputs(reads: UnitReads, graph: ImportGraph, extra: Iterable[str] = ()) -> list[str]:
    """A unit's inputs: what it read, its ``extra`` files (its own test file, its conftests), and what those
    reach through imports (:meth:`ImportGraph.inputs`; by the functions that ran, where every process of the
    unit was traced)."""
    ran = None
    if not reads.untraced:
        ran = {}
        for rel, line in reads.functions:
            ran.setdefault(rel, set()).add(line)
    return sorted(graph.inputs(sorted(set(reads.files) | set(extra)), ran))


def walk_tests(root: Path, paths: Iterable[str]) -> Iterator[str]:
    """The test files pytest collects under ``paths`` (``test_*.py``/``*_test.py``, or the file itself)."""
    for rel in paths:
        path = root / rel
        if path.is_file():
            yield rel
            continue
        for found in sorted(path.rglob("*.py")):
            name = found.name
            rel_found = found.relative_to(root).as_posix()
            if (name.startswith("test_") or name.endswith("_test.py")) and not ignored(rel_found):
                yield rel_found
