"""Start-up code for the judge and the child: modules inside the project are compiled from source.

Bytecode in ``__pycache__`` is ignored for every file under the project root (a tampered ``.pyc`` with
its source untouched cannot run), while installed packages keep their caches (re-compiling torch would
cost seconds per run). The code is a string run by ``python -B -c`` *before* anything from the project
is imported, so nothing it protects can switch it off.

Both processes leave through ``_leave``: the exit handlers run and the streams are flushed, then the process
exits without tearing the interpreter down. Every file is closed by then, and a teardown of torch (its
modules, its CUDA context) costs one to three seconds per process, paid twice by a judged run.
"""

from __future__ import annotations

import sys

SOURCE_ONLY = r'''
import importlib.machinery as _m, os as _os, sys as _sys
_ROOT = _os.path.realpath(_sys.argv.pop(1))
_SKIP = (_os.sep + ".venv" + _os.sep, _os.sep + "site-packages" + _os.sep, _os.sep + "dist-packages" + _os.sep)
class _SourceOnly(_m.SourceFileLoader):
    def get_code(self, fullname):
        path = self.get_filename(fullname)
        return self.source_to_code(self.get_data(path), path)
class _Finder:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        spec = _m.PathFinder.find_spec(name, path, target)
        origin = getattr(spec, "origin", None) or ""
        real = _os.path.realpath(origin) if origin else ""
        if spec is not None and real.startswith(_ROOT + _os.sep) and not any(s in real for s in _SKIP) \
                and isinstance(spec.loader, _m.SourceFileLoader):
            spec.loader = _SourceOnly(name, origin)
        return spec
    @classmethod
    def invalidate_caches(cls):
        _m.PathFinder.invalidate_caches()
_sys.meta_path.insert(0, _Finder)
_sys.dont_write_bytecode = True
def _leave(code):
    import atexit as _atexit
    _atexit._run_exitfuncs()
    for _stream in (_sys.stdout, _sys.stderr):
        try:
            _stream.flush()
        except Exception:
            pass
    _os._exit(int(code))
'''

#: the child: ``python -B -c CHILD <root> <pytest args>`` runs pytest like ``python -m pytest`` would
CHILD = SOURCE_ONLY + r'''
_sys.path.insert(0, _ROOT)
import pytest as _pytest
_leave(_pytest.main(_sys.argv[1:]))
'''

#: the judge: ``python -B -P -c JUDGE <root> <judge args>``
JUDGE = SOURCE_ONLY + r'''
try:  # Ctrl-C while the judge still imports: one line, exit 130 (nothing is written before its run begins)
    from pytest_ditgate.experiment.judge import main as _main
    _code = _main(_sys.argv[1:])
except KeyboardInterrupt:
    print("ditgate: interrupted", file=_sys.stderr)
    _code = 130
_leave(_code)
'''


#: a timing server (``timing_server.py``): ``python -B -c SERVER <root> <timing module> <impls> <rfd> <wfd>``; the
#: root (the candidate's tree, or a checkout of the best's commit) comes first on ``sys.path``
SERVER = SOURCE_ONLY + r'''
_sys.path.insert(0, _ROOT)
from pytest_ditgate.experiment.timing_server import main as _main
_leave(_main(_sys.argv[1:]))
'''


def command(code: str, root: str, *args: str) -> list[str]:
    return [sys.executable, "-B", "-c", code, root, *args]
