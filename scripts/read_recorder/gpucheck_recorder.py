"""Records what a run reads, unit by unit, so that a GPU check result is keyed by the files it depended on.

Loaded at interpreter start by the ``sitecustomize.py`` beside it when ``GPUCHECK_RECORD_DIR`` names a folder
(``scripts/gpu_inputs.py`` puts this folder on ``PYTHONPATH``, outside the project, for every process of a
recorded run). Each process appends JSON lines to a file of its own in that folder, one ``os.write`` a line,
so that a process that leaves through ``os._exit`` or is killed loses nothing written before:

- ``{"k": "proc", ...}`` first: pid, parent pid, argv, the unit it inherited, whether code is traced;
- ``{"k": "open", "u": unit, "p": path}`` a file opened for reading (modules too: their ``.py`` or ``.pyc``);
- ``{"k": "exec", "u": unit, "p": path, "l": line}`` code that ran (``sys.monitoring``, Python 3.12 and later),
  by its file and its code object's first line: the module's own code, or one function;
- ``{"k": "mod", "u": unit, "n": name}`` a module or distribution looked up (imported, found or asked for
  its version), present or not: the optional packages a unit reaches key its result;
- ``{"k": "copy", "u": unit, "src": path, "dst": path}`` a tree copied (``shutil.copytree``): what is read
  from the copy counts as read from the original;
- ``{"k": "blind", "u": unit, "argv": [...]}`` a Python process started without the recorder (an environment
  that drops it, ``-I``/``-S``/``-E``): what it reads is unknown, so its unit's inputs are;
- ``{"k": "nested", "u": unit, "dir": folder}`` a Python process that records into a folder of its own (a test
  of the recorder): what that folder holds counts for this unit;
- ``{"k": "unit", "u": unit}`` the unit (a test file) that the following lines belong to; a unit named
  ``fixture:<baseid>::<name>`` is the set-up of a fixture wider than a test;
- ``{"k": "uses", "u": unit, "f": fixture}`` a unit's test uses that fixture (set up in this unit or earlier).

A unit is the test file pytest collects or runs (set by a pytest plugin this module registers in every
pytest run, the outermost run deciding); a process started inside a unit inherits it (``GPUCHECK_RECORD_UNIT``)
and never changes it. Reads and lookups made inside the functions that ``GPUCHECK_RECORD_IGNORE_IN`` names
(``file-suffix:function,function;...``) are not recorded: hashing files against a lock that every CPU run
checks too, or noting package versions as provenance, makes no result depend on them.

Standard library only; it must never break the run it records: every failure here is swallowed.
"""

from __future__ import annotations

import json
import os
import sys
import threading

DIR_ENV = "GPUCHECK_RECORD_DIR"
UNIT_ENV = "GPUCHECK_RECORD_UNIT"
IGNORE_IN_ENV = "GPUCHECK_RECORD_IGNORE_IN"
#: "0": do not trace code (no sys.monitoring); a unit then gets everything its process read before it ended
TRACE_ENV = "GPUCHECK_RECORD_TRACE"
#: where no project file lives: reads there are not recorded (the interpreter, installed packages, devices)
_SYSTEM = ("/proc/", "/sys/", "/dev/", "/usr/", "/etc/", "/lib/", "/lib64/", "/bin/", "/sbin/", "/run/", "/var/lib/")


class _Recorder:
    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.lock = threading.RLock()
        inherited = os.environ.get(UNIT_ENV, "")
        self.inherited = bool(inherited)
        self.unit = inherited
        self.seen: set[tuple[str, str]] = set()
        self.skip = tuple(sorted({p for p in (sys.prefix, sys.base_prefix, sys.exec_prefix) if p})) + _SYSTEM
        here = os.path.dirname(os.path.abspath(__file__))
        self.skip += (here + os.sep, os.path.abspath(folder) + os.sep)
        self.ignore_in = _parse_ignore_in(os.environ.get(IGNORE_IN_ENV, ""))
        self.monitored = False
        self.pytest_patched = False
        self.fd = os.open(os.path.join(folder, f"{os.getpid()}-{os.urandom(4).hex()}.jsonl"),
                          os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.write({"k": "proc", "pid": os.getpid(), "ppid": os.getppid(), "argv": sys.argv[:8],
                    "unit": inherited, "python": sys.version.split()[0]})

    def write(self, line: dict) -> None:
        try:
            os.write(self.fd, (json.dumps(line, separators=(",", ":")) + "\n").encode())
        except (OSError, ValueError, TypeError):
            pass

    def note(self, kind: str, key: str, **fields: object) -> None:
        with self.lock:
            if (kind, key) in self.seen:
                return
            self.seen.add((kind, key))
            self.write({"k": kind, "u": self.unit, **fields})

    def enter(self, unit: str) -> None:
        """Lines from now on belong to ``unit`` (ignored in a process that inherited one)."""
        if self.inherited or unit == self.unit:
            return
        with self.lock:
            self.unit = unit
            self.seen.clear()
            os.environ[UNIT_ENV] = unit
            self.write({"k": "unit", "u": unit})
            if self.monitored:
                sys.monitoring.restart_events()

    def leave(self) -> None:
        if self.inherited or not self.unit:
            return
        with self.lock:
            self.unit = ""
            self.seen.clear()
            os.environ.pop(UNIT_ENV, None)
            self.write({"k": "unit", "u": ""})
            if self.monitored:
                sys.monitoring.restart_events()

    # -- what is recorded ----------------------------------------------------------------------------------
    def wanted(self, path: str) -> bool:
        return bool(path) and not path.startswith(self.skip) and "site-packages" not in path \
            and "dist-packages" not in path

    def audit(self, event: str, args: tuple) -> None:
        try:
            if event == "open":
                self.opened(args)
            elif event == "import":
                self.looked_up(str(args[0]).partition(".")[0])
                config = sys.modules.get("_pytest.config")
                if not self.pytest_patched and hasattr(config, "PytestPluginManager"):
                    # the first import once pytest's plugin manager class exists, before any manager is made
                    # (pytest.main makes one after ``import pytest`` has finished)
                    self.pytest_patched = True
                    _patch_pytest_manager(config, self)
            elif event == "shutil.copytree":
                self.note("copy", f"{args[0]}>{args[1]}", src=os.path.abspath(os.fspath(args[0])),
                          dst=os.path.abspath(os.fspath(args[1])))
            elif event == "cpython.run_file":
                self.opened((args[0], "r", 0))
            elif event in ("subprocess.Popen", "os.posix_spawn", "os.exec"):
                self.spawned(event, args)
        except Exception:  # noqa: BLE001 - the recorder never breaks the run
            pass

    def opened(self, args: tuple) -> None:
        path, mode, flags = (tuple(args) + (None, None, None))[:3]
        if isinstance(path, int) or path is None:
            return
        if isinstance(mode, str):
            if "r" not in mode and "+" not in mode:
                return
        elif isinstance(flags, int) and flags & os.O_ACCMODE == os.O_WRONLY:
            return
        path = os.fsdecode(path) if isinstance(path, bytes) else os.fspath(path)
        if not os.path.isabs(path):
            # relative to the current folder, or to a folder descriptor the event does not name (os.open's
            # dir_fd, as compilers' caches use): kept only where it names a file of the current folder
            path = os.path.abspath(path)
            if not os.path.isfile(path):
                return
        if not self.wanted(path) or ("open", path) in self.seen:
            return
        if self.ignore_in and self.in_ignored_function():
            return
        self.note("open", path, p=path)

    def spawned(self, event: str, args: tuple) -> None:
        """Note a Python process that will not run the recorder."""
        if event == "subprocess.Popen":
            executable, argv, env = args[0], args[1], args[3] if len(args) > 3 else None
        else:
            executable, argv, env = args[0], args[1], args[2] if len(args) > 2 else None
        if isinstance(argv, (str, bytes, os.PathLike)):
            argv = [argv]
        argv = [os.fsdecode(a) if isinstance(a, bytes) else str(a) for a in (argv or [])]
        program = os.fsdecode(executable) if isinstance(executable, bytes) else str(executable or (argv[:1] or [""])[0])
        if not _is_python(program, argv):
            return
        isolated = any(a.startswith("-") and not a.startswith("--") and set(a[1:]) & set("ISE") and len(a) <= 4
                       for a in argv[1:3])
        if env is not None and not isolated:
            env = {os.fsdecode(k) if isinstance(k, bytes) else k: os.fsdecode(v) if isinstance(v, bytes) else v
                   for k, v in dict(env).items()}
            paths = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
            started = any(os.path.isfile(os.path.join(p, "gpucheck_recorder.py")) for p in paths)
            folder = env.get(DIR_ENV)
            if not started or not folder:
                isolated = True
            elif os.path.abspath(folder) != os.path.abspath(self.folder):
                self.write({"k": "nested", "u": self.unit, "dir": os.path.abspath(folder)})
                return
        if isolated:
            self.write({"k": "blind", "u": self.unit, "argv": argv[:6]})

    def looked_up(self, name: str) -> None:
        if ("mod", name) in self.seen or (self.ignore_in and self.in_ignored_function()):
            return
        self.note("mod", name, n=name)

    def in_ignored_function(self) -> bool:
        frame = sys._getframe(1)
        while frame is not None:
            code = frame.f_code
            for suffix, names in self.ignore_in:
                if code.co_name in names and code.co_filename.endswith(suffix):
                    return True
            frame = frame.f_back
        return False

    def executed(self, code, offset):  # sys.monitoring PY_START: once a code object per unit
        try:
            path = code.co_filename
            if path and path[0] == os.sep and self.wanted(path):
                self.note("exec", f"{path}:{code.co_firstlineno}", p=path, l=code.co_firstlineno)
        except Exception:  # noqa: BLE001
            pass
        return sys.monitoring.DISABLE

    def monitor(self) -> None:
        monitoring = getattr(sys, "monitoring", None)
        if monitoring is None or os.environ.get(TRACE_ENV) == "0":
            return
        for tool in (4, 3, 5, 1):
            if monitoring.get_tool(tool) is None:
                monitoring.use_tool_id(tool, "gpucheck_recorder")
                monitoring.register_callback(tool, monitoring.events.PY_START, self.executed)
                monitoring.set_events(tool, monitoring.events.PY_START)
                self.monitored = True
                self.write({"k": "monitor", "tool": tool})
                return


def _is_python(program: str, argv: list[str]) -> bool:
    """Whether ``program`` starts a Python interpreter: one by name, this interpreter, ``env python...``, or a
    script whose ``#!`` line names Python (a console script such as ``ditgate`` or ``pytest``)."""
    import shutil

    name = os.path.basename(program)
    if name == "env":
        rest = [a for a in argv[1:] if not a.startswith("-") and "=" not in a]
        return bool(rest) and os.path.basename(rest[0]).startswith("python")
    if name.startswith("python"):
        return True
    found = program if os.sep in program else shutil.which(program)
    if not found:
        return False
    if os.path.realpath(found) == os.path.realpath(sys.executable):
        return True
    try:
        with open(found, "rb") as handle:
            first = handle.readline(256)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


def _parse_ignore_in(value: str) -> tuple[tuple[str, frozenset[str]], ...]:
    rules = []
    for part in filter(None, value.split(";")):
        suffix, _, names = part.partition(":")
        rules.append((suffix, frozenset(filter(None, names.split(",")))))
    return tuple(rules)


# -- pytest: the unit is the test file being collected or run ------------------------------------------------

def _patch_pytest_manager(module, recorder: _Recorder) -> None:
    """Register a unit plugin in each new pytest plugin manager (``_pytest.config.PytestPluginManager``); only
    the first one, the outermost run of the process, switches units (in-process pytester runs are inside it)."""
    from pluggy import HookimplMarker

    hookimpl = HookimplMarker("pytest")
    outermost: list[object] = []

    class PytestUnits:
        def __init__(self) -> None:
            if not outermost:
                outermost.append(self)

        def _switch(self, path: object):
            if outermost[0] is not self or path is None:
                return None
            before = recorder.unit
            recorder.enter(os.path.abspath(os.fspath(path)))
            return before

        @staticmethod
        def _back(before) -> None:
            if before is not None:
                recorder.enter(before) if before else recorder.leave()

        @hookimpl(hookwrapper=True)
        def pytest_make_collect_report(self, collector):
            from _pytest.nodes import File

            before = self._switch(getattr(collector, "path", None)) if isinstance(collector, File) else None
            try:
                yield
            finally:
                self._back(before)

        @hookimpl(hookwrapper=True)
        def pytest_runtest_protocol(self, item, nextitem):
            before = self._switch(getattr(item, "path", None))
            if before is not None:
                try:
                    for defs in getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {}).values():
                        if defs and defs[-1].scope != "function":
                            fid = _fixture_id(defs[-1])
                            recorder.note("uses", fid, f=fid)
                except Exception:  # noqa: BLE001
                    pass
            try:
                yield
            finally:
                self._back(before)

        @hookimpl(hookwrapper=True)
        def pytest_fixture_setup(self, fixturedef, request):
            # a fixture wider than a test is set up once, in the first unit that asks for it, and used by later
            # ones from pytest's cache: what its set-up reads counts for every unit that uses it
            before = None
            if outermost[0] is self and fixturedef.scope != "function" and not recorder.inherited:
                before = recorder.unit
                recorder.enter(_fixture_id(fixturedef))
            try:
                yield
            finally:
                self._back(before)

    def _fixture_id(fixturedef) -> str:
        return f"fixture:{fixturedef.baseid}::{fixturedef.argname}"

    manager = module.PytestPluginManager
    original = manager.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        try:
            self.register(PytestUnits(), "gpucheck_recorder")
        except Exception:  # noqa: BLE001
            pass

    manager.__init__ = __init__


def _patch_lookups(recorder: _Recorder) -> None:
    """Distribution and module lookups that read no file of the project (a version asked for, a spec found)."""
    import importlib.metadata as metadata
    import importlib.util as util

    from_name = metadata.Distribution.from_name.__func__

    def distribution(cls, name, *args, **kwargs):
        recorder.looked_up(str(name))
        return from_name(cls, name, *args, **kwargs)

    metadata.Distribution.from_name = classmethod(distribution)
    find_spec = util.find_spec

    def found(name, package=None):
        recorder.looked_up(str(name).lstrip(".").partition(".")[0])
        return find_spec(name, package)

    util.find_spec = found


def start() -> None:
    folder = os.environ.get(DIR_ENV)
    if not folder or getattr(sys, "_gpucheck_recorder", None) is not None:
        return
    try:
        recorder = _Recorder(folder)
    except OSError:
        return
    sys._gpucheck_recorder = recorder  # type: ignore[attr-defined]
    sys.addaudithook(recorder.audit)
    recorder.monitor()
    try:
        _patch_lookups(recorder)
    except Exception:  # noqa: BLE001
        pass
