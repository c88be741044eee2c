"""What a GPU check unit depends on (scripts/gpu_inputs.py, scripts/read_recorder/): a recorded pytest run of a
small project, its units' inputs, and the keys that follow from them.

The project has two test files. ``test_lazy.py`` imports ``pkg.api`` at module level and, inside a test,
``pkg.heavy`` (a lazy import), opens a data file, starts a Python child that reads another, and copies a folder
of the project and reads from the copy. ``test_plain.py`` runs after it in the same process and uses
``pkg.heavy.TABLE`` through an import that is cached by then, without running any of its code. Both use a
session fixture that ``test_lazy`` sets up (it imports ``pkg.fix`` and reads a data file); ``test_plain`` gets
it from the cache. Every file either unit would read if it ran alone must be among its inputs; a file only the
other unit reaches must not be.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
RECORDER = SCRIPTS / "read_recorder"

FILES = {
    "pyproject.toml": "[tool.pytest.ini_options]\naddopts = '-p no:cacheprovider'\n",
    "pkg/__init__.py": "",
    "pkg/api.py": ("from pkg import util\n\ndef answer():\n    return util.SIX * 7\n\n\n"
                   "def rarely():\n    from pkg import rare\n    return rare.R\n"),
    "pkg/rare.py": "R = 1\n",
    "pkg/util.py": "SIX = 6\n",
    "pkg/heavy.py": "TABLE = {'a': 1}\n\ndef work():\n    return sum(TABLE.values())\n",
    "pkg/unused.py": "X = 1\n",
    "pkg/judge.py": "def judge():\n    from pkg import unused\n    return unused.X\n",
    "data/one.txt": "1\n",
    "data/child.txt": "2\n",
    "tree/inside.txt": "3\n",
    "pkg/fix.py": "def build():\n    from pathlib import Path\n    return (Path(__file__).parents[1] / 'data' / 'fixture.txt').read_text()\n",
    "data/fixture.txt": "f\n",
    "tests/conftest.py": ("import pytest\n\n"
                          "@pytest.fixture(scope='session')\n"
                          "def shared():\n"
                          "    from pkg import fix\n"
                          "    return fix.build()\n"),
    "tests/test_lazy.py": (
        "import shutil, subprocess, sys\n"
        "from pathlib import Path\n"
        "from pkg import api\n"
        "ROOT = Path(__file__).resolve().parents[1]\n\n"
        "def test_lazy(tmp_path, shared):\n"
        "    from pkg import heavy\n"
        "    assert heavy.work() == 1 and api.answer() == 42\n"
        "    assert (ROOT / 'data' / 'one.txt').read_text() == '1\\n'\n"
        "    code = f\"print(open({str(ROOT / 'data' / 'child.txt')!r}).read())\"\n"
        "    subprocess.run([sys.executable, '-c', code], check=True)\n"
        "    shutil.copytree(ROOT / 'tree', tmp_path / 'copy')\n"
        "    assert (tmp_path / 'copy' / 'inside.txt').read_text() == '3\\n'\n"
    ),
    "tests/test_plain.py": (
        "def test_plain(shared):\n"
        "    assert shared == 'f\\n'\n"
        "    from pkg.heavy import TABLE\n"
        "    assert TABLE == {'a': 1}\n"
    ),
}


@pytest.fixture(scope="module")
def gpu_stages():
    sys.path.insert(0, str(SCRIPTS))
    try:
        import gpu_stages as module
    finally:
        sys.path.remove(str(SCRIPTS))
    return module


@pytest.fixture(scope="module")
def gpu_inputs():
    sys.path.insert(0, str(SCRIPTS))
    try:
        import gpu_inputs as module
    finally:
        sys.path.remove(str(SCRIPTS))
    return module


def _project(base: Path, files: dict[str, str] = FILES) -> Path:
    for rel, text in files.items():
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_text(text)
    return base


def _python312() -> str | None:
    """An interpreter with sys.monitoring (3.12 or later), to check the traced mode where one is at hand."""
    if sys.version_info >= (3, 12):
        return sys.executable
    # on the PATH, or installed beside this interpreter (pyenv's versions/, for one)
    beside = sorted(Path(sys.base_prefix).parent.glob("3.1[2-9]*/bin/python3"))
    for found in [shutil.which(n) for n in ("python3.13", "python3.12")] + [str(p) for p in beside]:
        if found and subprocess.run([found, "-c", "import sys; assert sys.version_info >= (3, 12)"],
                                    capture_output=True).returncode == 0:
            return found
    return None


def _recorded_run(project: Path, python: str, folder: Path, extra_env: dict[str, str] | None = None) -> None:
    code = folder.parent / "recorder"
    code.mkdir(exist_ok=True)
    for name in ("sitecustomize.py", "gpucheck_recorder.py"):
        shutil.copy2(RECORDER / name, code / name)
    folder.mkdir()
    # the interpreter may be another Python than this one: pytest (pure Python) comes from this environment
    site = sysconfig.get_paths()["purelib"]
    # reads inside copytree do not count, as in the GPU check: tree/inside.txt is an input only because it is read
    # from the copy
    env = {**os.environ, "GPUCHECK_RECORD_DIR": str(folder), "PYTHONDONTWRITEBYTECODE": "1",
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "GPUCHECK_RECORD_IGNORE_IN": "/shutil.py:copytree,_copytree",
           "PYTHONPATH": os.pathsep.join([str(code), str(project), site]), **(extra_env or {})}
    for name in ("GPUCHECK_RECORD_UNIT", "GPUCHECK_RECORD_TRACE"):  # a recording of this test's own run (CI's)
        env.pop(name, None)
    run = subprocess.run([python, "-m", "pytest", "-q", "tests/test_lazy.py", "tests/test_plain.py"], cwd=project, env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


def _inputs(gpu_inputs, project: Path, folder: Path) -> dict[str, list[str]]:
    reads = gpu_inputs.unit_reads(gpu_inputs.Recording.load(folder), project)
    graph = gpu_inputs.ImportGraph(project)
    return {unit: gpu_inputs.unit_inputs(reads[unit], graph, [unit, *gpu_inputs.conftests(unit, project)])
            for unit in ("tests/test_lazy.py", "tests/test_plain.py")}


@pytest.mark.parametrize("mode", ["this interpreter", "traced (sys.monitoring)"])
def test_every_file_a_unit_imports_or_opens_is_among_its_inputs(tmp_path: Path, gpu_inputs, mode: str) -> None:
    python = sys.executable if mode == "this interpreter" else _python312()
    if python is None:
        pytest.skip("no Python 3.12 or later on this machine to trace code with sys.monitoring")
    project = _project(tmp_path / "project")
    _recorded_run(project, python, tmp_path / "record")
    inputs = _inputs(gpu_inputs, project, tmp_path / "record")
    lazy, plain = set(inputs["tests/test_lazy.py"]), set(inputs["tests/test_plain.py"])
    # what test_lazy imported (eagerly and lazily), opened, had a child read, and read from a copy of the tree
    assert {"tests/test_lazy.py", "tests/conftest.py", "pkg/__init__.py", "pkg/api.py", "pkg/util.py", "pkg/heavy.py",
            "data/one.txt", "data/child.txt", "tree/inside.txt", "pyproject.toml"} <= lazy
    # test_plain used pkg.heavy's table through an import cached by test_lazy: no file was read, no code ran
    assert {"tests/test_plain.py", "pkg/heavy.py", "pkg/__init__.py"} <= plain
    # and the session fixture test_lazy set up: what its set-up read counts for every unit that uses it
    assert {"pkg/fix.py", "data/fixture.txt"} <= lazy & plain
    # nothing imported pkg.judge or pkg.unused: no unit is keyed on them
    assert not {"pkg/judge.py", "pkg/unused.py"} & (lazy | plain)
    if mode != "this interpreter" or sys.version_info >= (3, 12):
        # traced: test_plain is not keyed on what only test_lazy read, and no unit on what a function that never
        # ran would import (pkg.api.rarely)
        assert not {"data/one.txt", "data/child.txt", "pkg/api.py"} & plain
        assert "pkg/rare.py" not in lazy | plain
    else:  # untraced, every function of a file that was read counts
        assert "pkg/rare.py" in lazy


def test_a_change_outside_the_inputs_keeps_the_key_and_one_inside_changes_it(tmp_path: Path, gpu_inputs) -> None:
    sys.path.insert(0, str(SCRIPTS))
    try:
        import gpu_record
    finally:
        sys.path.remove(str(SCRIPTS))
    project = _project(tmp_path / "project")
    _recorded_run(project, sys.executable, tmp_path / "record")
    inputs = _inputs(gpu_inputs, project, tmp_path / "record")["tests/test_lazy.py"]

    def key() -> str:
        return gpu_record.inputs_digest(inputs, gpu_record.Hashes(project))

    before = key()
    (project / "pkg" / "unused.py").write_text("X = 2\n")  # outside
    (project / "README.md").write_text("docs\n")
    assert key() == before
    (project / "pkg" / "util.py").write_text("SIX = 6  # edited\n")  # inside
    assert key() != before
    edited = key()
    # a new import edge in an input: the file changes, so the key does; the next run reads the new module
    (project / "pkg" / "api.py").write_text(FILES["pkg/api.py"] + "from pkg import judge\n")
    assert key() != edited
    shutil.rmtree(tmp_path / "record")
    _recorded_run(project, sys.executable, tmp_path / "record")
    assert "pkg/judge.py" in _inputs(gpu_inputs, project, tmp_path / "record")["tests/test_lazy.py"]


def test_the_import_graph_follows_lazy_tables_only_for_the_names_asked_for(tmp_path: Path, gpu_inputs) -> None:
    """``from pkg import cheap`` through a lazy-export table reaches the module behind ``cheap`` only: a run that
    never asks for ``expensive`` is not keyed on its module. Strings naming modules count (plugin lists,
    ``importlib.import_module``); ``if TYPE_CHECKING`` imports never run and do not."""
    files = {
        "lazypkg/__init__.py": ("from typing import TYPE_CHECKING\n"
                                "_LAZY = {'cheap': 'lazypkg.cheap', 'expensive': 'lazypkg.expensive'}\n"
                                "if TYPE_CHECKING:\n    from lazypkg import typed\n"),
        "lazypkg/cheap.py": "def cheap():\n    return 1\n",
        "lazypkg/expensive.py": "import lazypkg.deep\n",
        "lazypkg/deep.py": "",
        "lazypkg/typed.py": "",
        "lazypkg/plugins.py": "import importlib\nNAMES = ('lazypkg.registered',)\n",
        "lazypkg/registered.py": "",
        "user.py": "from lazypkg import cheap\n",
    }
    graph = gpu_inputs.ImportGraph(_project(tmp_path, files))
    assert graph.inputs({"user.py"}) == {"user.py", "lazypkg/__init__.py", "lazypkg/cheap.py"}
    assert "lazypkg/registered.py" in graph.inputs({"lazypkg/plugins.py"})
    assert graph.inputs({"lazypkg/expensive.py"}) >= {"lazypkg/deep.py", "lazypkg/__init__.py"}


def test_a_word_in_a_string_is_a_module_only_where_the_file_imports_by_name(tmp_path: Path, gpu_inputs) -> None:
    """``MODES = ("torch", "kernels")`` names a setting, not an import: a run of that file is not keyed on the
    ``kernels`` package. A function that imports by name (``importlib.import_module("kernels")``) reaches it
    when that function ran, and so does a module constant the file's import call may be given."""
    files = {
        "kernels/__init__.py": "from kernels import ops\n",
        "kernels/ops.py": "",
        "options.py": 'MODES = ("torch", "kernels", "auto")\n',
        "pick.py": ('import importlib\n'
                    'def resolve(mode):\n    return mode == "torch"\n\n'
                    'def package():\n    return importlib.import_module("kernels")\n'),
        "named.py": 'import importlib\nNAME = "kernels"\ndef load():\n    return importlib.import_module(NAME)\n',
        "conftest.py": 'pytest_plugins = ["kernels"]\n',
    }
    graph = gpu_inputs.ImportGraph(_project(tmp_path, files))
    kernels = {"kernels/__init__.py", "kernels/ops.py"}
    assert graph.inputs({"options.py"}) == {"options.py"}
    assert not graph.inputs({"pick.py"}, ran={"pick.py": {2}}) & kernels  # only resolve() ran
    assert graph.inputs({"pick.py"}, ran={"pick.py": {2, 5}}) >= kernels
    assert graph.inputs({"pick.py"}) >= kernels  # untraced: every function counts
    assert graph.inputs({"named.py"}, ran={"named.py": set()}) >= kernels
    assert graph.inputs({"conftest.py"}) >= kernels


def test_a_python_child_started_without_the_recorder_makes_the_unit_unrecorded(tmp_path: Path, gpu_inputs,
                                                                              monkeypatch) -> None:
    """A derived-input miss: a test starts a Python process whose environment drops the recorder (or runs it
    isolated), so what that process reads is unknown. The unit is named as unrecorded (the GPU check fails it),
    never keyed on less. A child that inherits the environment is recorded; one that records into a folder of
    its own is a nested recording, read with the unit's; other programs are not Python."""
    spec = importlib.util.spec_from_file_location("recorder_under_test", RECORDER / "gpucheck_recorder.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    folder, nested = tmp_path / "record", tmp_path / "nested"
    folder.mkdir()
    nested.mkdir()
    (nested / "1.jsonl").write_text('{"k":"proc","pid":1,"unit":""}\n'
                                    f'{{"k":"open","u":"","p":"{tmp_path / "project" / "data.txt"}"}}\n')
    monkeypatch.delenv("GPUCHECK_RECORD_UNIT", raising=False)
    recorder = module._Recorder(str(folder))
    recorder.enter(str(tmp_path / "project" / "tests" / "test_x.py"))
    code = str(RECORDER)
    python = sys.executable
    recorded = {"GPUCHECK_RECORD_DIR": str(folder), "PYTHONPATH": code}
    recorder.spawned("subprocess.Popen", (python, [python, "-c", "pass"], None, None))  # inherits: recorded
    recorder.spawned("subprocess.Popen", (python, [python, "-c", "pass"], None, recorded))
    recorder.spawned("subprocess.Popen", ("git", ["git", "status"], None, {}))  # not Python
    recorder.spawned("subprocess.Popen", (python, [python, "-c", "import pkg.unused"], None, {"PATH": "/bin"}))
    recorder.spawned("os.posix_spawn", (python, [python, "-I", "-c", "pass"], None))
    script = tmp_path / "console-script"  # a console script (ditgate, pytest) is Python by its #! line
    script.write_text(f"#!{python}\nimport sys\n")
    recorder.spawned("subprocess.Popen", (None, [str(script), "experiment"], None, {"PATH": "/bin"}))
    recorder.spawned("subprocess.Popen", (python, [python, "-c", "pass"], None,
                                          {**recorded, "GPUCHECK_RECORD_DIR": str(nested)}))
    project = tmp_path / "project"
    (project / "tests").mkdir(parents=True)
    (project / "data.txt").write_text("x")
    reads = gpu_inputs.unit_reads(gpu_inputs.Recording.load(folder), project)["tests/test_x.py"]
    assert [line.rpartition(" -c ")[2] for line in reads.blind[:2]] == ["import pkg.unused", "pass"]
    assert "-I" in reads.blind[1] and reads.blind[2] == f"{script} experiment" and len(reads.blind) == 3
    assert "data.txt" in reads.files  # read by the nested recording's process, counted for the unit


def test_pyc_files_and_copies_map_to_their_sources(tmp_path: Path, gpu_inputs) -> None:
    root = tmp_path / "root"
    (root / "pkg" / "__pycache__").mkdir(parents=True)
    copy = tmp_path / "copy"
    aliases = gpu_inputs._aliases([(str(root), str(copy)), (str(copy / "pkg"), str(tmp_path / "again"))], root)
    rel = gpu_inputs.relative
    assert rel(str(root / "pkg" / "__pycache__" / "mod.cpython-312.pyc"), root, aliases) == "pkg/mod.py"
    assert rel(str(root / "pkg" / "__pycache__" / "mod.cpython-311-pytest-9.2.0.pyc"), root, aliases) == "pkg/mod.py"
    assert rel(str(copy / "pkg" / "a.py"), root, aliases) == "pkg/a.py"
    assert rel(str(tmp_path / "again" / "b.py"), root, aliases) == "pkg/b.py"
    assert rel(str(tmp_path / "elsewhere.py"), root, aliases) is None
    assert rel(str(root / "README.md"), root, aliases) is None  # documentation is never an input
    assert rel(str(root / ".ditgate" / "ledger.jsonl"), root, aliases) is None


def test_the_recorder_never_breaks_a_process(tmp_path: Path, monkeypatch) -> None:
    """A record folder that cannot be written: the recorder does not start, and nothing is raised (checked in
    this process: a child started so would run unrecorded, which a recorded run of this test would flag)."""
    spec = importlib.util.spec_from_file_location("recorder_unstarted", RECORDER / "gpucheck_recorder.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setenv("GPUCHECK_RECORD_DIR", str(tmp_path / "missing" / "deeper"))
    monkeypatch.delattr(sys, "_gpucheck_recorder", raising=False)
    hooks = []
    monkeypatch.setattr(sys, "addaudithook", hooks.append)
    module.start()
    assert hooks == [] and getattr(sys, "_gpucheck_recorder", None) is None


def test_the_recorder_chains_to_the_sitecustomize_it_shadows(tmp_path: Path) -> None:
    code, other = tmp_path / "recorder", tmp_path / "other"
    code.mkdir()
    other.mkdir()
    for name in ("sitecustomize.py", "gpucheck_recorder.py"):
        shutil.copy2(RECORDER / name, code / name)
    (other / "sitecustomize.py").write_text("import builtins\nbuiltins.SHADOWED_RAN = True\n")
    folder = tmp_path / "record"
    folder.mkdir()
    env = {**os.environ, "GPUCHECK_RECORD_DIR": str(folder), "PYTHONPATH": os.pathsep.join([str(code), str(other)])}
    run = subprocess.run([sys.executable, "-c", "import builtins, sys; print(builtins.SHADOWED_RAN, "
                          "sys._gpucheck_recorder is not None)"], env=env, capture_output=True, text=True, timeout=60)
    assert run.stdout.split() == ["True", "True"], run.stderr


OBSERVER = '''
import os, sys

SEEN = set()


HASHING = {"expand", "table_digest", "evaluate_lock"}  # fixed_paths.py comparing the files with their lock


def _hashing():
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name in HASHING and frame.f_code.co_filename.endswith("fixed_paths.py"):
            return True
        frame = frame.f_back
    return False


def _audit(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        mode = args[1]
        if (not isinstance(mode, str) or "r" in mode or "+" in mode) and not _hashing():
            SEEN.add(os.path.abspath(os.fsdecode(args[0])))


sys.addaudithook(_audit)


def pytest_sessionfinish(session):
    files = {getattr(m, "__file__", None) for m in list(sys.modules.values())} | SEEN
    with open(os.environ["OBSERVED"], "w") as out:
        out.write("\\n".join(sorted(f for f in files if f)))
'''


def test_this_projects_units_are_keyed_on_every_file_their_tests_load(tmp_path: Path, gpu_inputs, gpu_stages) -> None:
    """Two of the project's own test files run in one recorded pytest process, as the GPU check runs them; the
    second is then run alone in a fresh process under an independent observer (every module it ends up with
    and every file it opens). Everything the observer saw of the project is among the second's inputs,
    although in the recorded run the first had imported most of it already."""
    first, second = "tests/plugin/test_verdict_core.py", "tests/plugin/test_report.py"
    folder = tmp_path / "record"
    folder.mkdir()
    code = tmp_path / "recorder"
    code.mkdir()
    for name in ("sitecustomize.py", "gpucheck_recorder.py"):
        shutil.copy2(RECORDER / name, code / name)
    # the recorded run records into a folder of its own (nested, where a GPU check records this test); the fresh
    # run keeps whatever records this test
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT"))}
    recorded = {k: v for k, v in base.items() if k != "GPUCHECK_RECORD_UNIT"}
    recorded.update({"GPUCHECK_RECORD_DIR": str(folder), "PYTHONDONTWRITEBYTECODE": "1",
                "GPUCHECK_RECORD_IGNORE_IN": gpu_stages.IGNORE_IN,
                     "PYTHONPATH": os.pathsep.join(filter(None, [str(code), base.get("PYTHONPATH")]))})
    pytest_args = ["-m", "pytest", "--ditgate", "-p", "no:cacheprovider", "-p", "no:xdist", "-q"]
    run = subprocess.run([sys.executable, *pytest_args, first, second], cwd=ROOT, env=recorded, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:]
    reads = gpu_inputs.unit_reads(gpu_inputs.Recording.load(folder), ROOT)
    inputs = set(gpu_inputs.unit_inputs(reads[second], gpu_inputs.ImportGraph(ROOT),
                                        [second, *gpu_inputs.conftests(second, ROOT)]))
    (tmp_path / "observer").mkdir()
    (tmp_path / "observer" / "observer_plugin.py").write_text(OBSERVER)
    observed_file = tmp_path / "observed.txt"
    fresh = {**base, "OBSERVED": str(observed_file),
             "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "observer"), base.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, *pytest_args, "-p", "observer_plugin", second], cwd=ROOT, env=fresh,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:]
    observed = {gpu_inputs.relative(line, ROOT, []) for line in observed_file.read_text().splitlines()}
    observed = {p for p in observed if p is not None and (ROOT / p).is_file()}
    assert len(observed) > 20 and observed <= inputs, sorted(observed - inputs)
    assert "src/pytest_ditgate/experiment/judge.py" not in inputs  # never reached by these tests
