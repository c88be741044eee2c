"""The JIT core: specs, cache identity, locking, arch filtering, toolkit discovery and API logging.

Torch-free at import. Paths and switches come from :mod:`kernels.jit.env`, read at call time.
"""

from kernels.jit.errors import (BuildError, JitError, LockTimeoutError, MissingJitCacheError,
                                ToolkitNotFoundError, UnsupportedArchError)
from kernels.jit.spec import JitSpec, LoadedModule, module_uri

__all__ = ["BuildError", "JitError", "JitSpec", "LoadedModule", "LockTimeoutError", "MissingJitCacheError",
           "ToolkitNotFoundError", "UnsupportedArchError", "module_uri"]
