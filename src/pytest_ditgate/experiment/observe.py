"""What the candidate's process actually executes, as class evidence (child side; imports torch).

Two views, both recorded to the output folder and judged by the judge:

* :class:`DispatchObserver`, a ``TorchDispatchMode`` active while a test runs (paused while ``ditbench``
  times): every op touching an fp8/fp4/int4 tensor, every GEMM/conv with an integer operand, and GEMM/conv
  weights whose values sit on a low-bit grid (int8 values stored in fp32, dequantized on the fly), and the
  float32 GEMMs/convs that ran on a GPU while TF32 was allowed for them (``tf32_gemms``: the judge then holds
  float32 outputs to TF32's limits, by what executed). It
  lets ``torch.compile`` run as compiled (``ignore_compile_internals``) and reads no values while a CUDA
  graph is being captured. A weight's values are sampled on the device when it is first seen and read
  after the test's call, all at once: the candidate's calls never wait on a device-to-host copy.
* :func:`scan_modules`, after each test: every ``nn.Module`` alive in the process (the VAE too, modules
  quantized on their first call too), its parameters, buffers and tensor attributes. A tensor judged
  before is judged again only when it was written (its version counter) or re-pointed since, so the
  repeated scans of a session's cached models cost no device reads. The first scan, the last test's and
  the session's end find the modules through the garbage collector; the others take the modules found
  so far plus those torch's registration hooks saw built since (:func:`watch_modules`).

A uint8/bool mask (values 0/1) or an integer index buffer is not quantization.
"""

from __future__ import annotations

import gc
import types
import weakref
from itertools import compress
from typing import Any

from pytest_ditgate.dtypes import torch_name

FLOAT_LOW_BIT = ("float8", "float4")
INT_LOW_BIT = ("int8", "uint8", "int4", "uint4", "qint", "quint")
GEMM_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addmv", "mv", "_int_mm", "_scaled_mm",
                      "convolution", "_convolution", "conv2d", "conv1d", "conv3d", "cudnn_convolution",
                      "_weight_int8pack_mm", "_weight_int4pack_mm", "_weight_int4pack_mm_for_cpu"})
CONV_OPS = frozenset({"convolution", "_convolution", "conv2d", "conv1d", "conv3d", "cudnn_convolution"})
CHUNK = 32
#: weights smaller than this are not judged by their values (filters such as an 11x11 gaussian window
#: repeat values by design; quantized weights worth the name are larger)
MIN_GRID_ELEMENTS = 4096
#: a gap below the span / this is not a level step (a dither on grid values, or repeats of one level)
DITHER_SPAN = 1024
#: how far (in steps) a value may sit from the grid: a dither of a tenth of a step does not hide it
GRID_TOLERANCE = 0.1


def _dtype(t: Any) -> str:
    return torch_name(t.dtype)


def low_bit_float(name: str) -> bool:
    return name.startswith(FLOAT_LOW_BIT)


def low_bit_int(name: str) -> bool:
    return name.startswith(INT_LOW_BIT)


def grid_sample(tensor: Any) -> Any:
    """Four chunks of 32 contiguous values of a float tensor, as a float64 ``(4, 32)`` tensor on its device
    (queued, not read: many are read back together), or None when its values are not judged."""
    import torch

    if tensor.numel() < MIN_GRID_ELEMENTS or not tensor.is_floating_point() or low_bit_float(_dtype(tensor)):
        return None
    flat = tensor.detach()
    if flat.dim() == 2 and not flat.is_contiguous() and flat.t().is_contiguous():
        flat = flat.t()
    flat = flat.reshape(-1)
    n = flat.numel()
    starts = [0, n // 3, (2 * n) // 3, n - CHUNK]
    return torch.stack([flat[s:s + CHUNK] for s in starts]).to(torch.float64)


def grid_verdict(rows: Any) -> str | None:
    """Why four sampled chunks (lists of floats) look quantized: every chunk must say so."""
    verdicts = [_chunk_grid(row) for row in rows]
    return verdicts[0] if verdicts and all(verdicts) else None


def read_samples(pending: list[tuple[str, Any]]) -> list[tuple[str, str | None]]:
    """(label, verdict) for every (label, grid sample): one device-to-host copy per device, not per tensor."""
    import torch

    by_device: dict[Any, list[tuple[str, Any]]] = {}
    for label, sample in pending:
        by_device.setdefault(sample.device, []).append((label, sample))
    out = []
    for items in by_device.values():
        rows = torch.cat([sample for _, sample in items]).to("cpu").tolist()
        out += [(label, grid_verdict(rows[4 * i:4 * i + 4])) for i, (label, _) in enumerate(items)]
    return out


def _chunk_grid(row: Any) -> str | None:
    values = sorted(set(row))
    if len(values) < 3:
        return None  # constants, zeros, one-hot: not evidence
    if len(values) <= CHUNK // 2:
        return f"{len(values)} distinct values in {CHUNK} (a low-bit codebook)"
    lo, hi = values[0], values[-1]
    # gaps far below a step are a dither added to hide the grid (or one level's repeats): not the step
    gaps = [g for g in (b - a for a, b in zip(values, values[1:])) if g > (hi - lo) / DITHER_SPAN]
    if not gaps:
        return None
    least = min(gaps)
    one_level = [g for g in gaps if g < 1.5 * least]  # the gaps of one level: their mean has less of the dither
    for divisor in (1, 2, 3):  # the chunk's smallest level gap may span two or three levels
        levels = _grid_levels(values, sum(one_level) / len(one_level) / divisor)
        if levels:
            return f"values on a grid of {levels} levels"
    return None


def _grid_levels(values: list[float], step: float) -> int | None:
    """How many levels a grid of about ``step`` through the sorted ``values`` spans, when every value sits
    within ``GRID_TOLERANCE`` of a level (None otherwise). Each value's level is counted from its neighbour's
    (a local gap carries little of the estimate's error), then the step and offset are fitted to all values:
    a dithered grid of 180 levels defeats a step read off one gap, not a fitted one."""
    if step <= 0 or (values[-1] - values[0]) / step > 256:
        return None
    level = [0]
    for a, b in zip(values, values[1:]):
        level.append(level[-1] + round((b - a) / step))
    if level[-1] < 2 or level[-1] > 256:
        return None
    for _ in range(2):
        mean_k, mean_v = sum(level) / len(level), sum(values) / len(values)
        spread = sum((k - mean_k) ** 2 for k in level)
        if spread <= 0:
            return None
        step = sum((k - mean_k) * (v - mean_v) for k, v in zip(level, values)) / spread
        if step <= 0:
            return None
        offset = mean_v - step * mean_k
        level = [round((v - offset) / step) for v in values]
    if max(abs((v - offset) / step - k) for k, v in zip(level, values)) >= GRID_TOLERANCE:
        return None
    return max(level) - min(level) + 1


class _Evidence:
    def __init__(self) -> None:
        self.items: list[str] = []
        self.gemms = 0
        self.ops = 0
        #: float32 GEMMs/convs on a GPU that ran with TF32 allowed (torch's matmul precision, cuDNN's switch)
        self.tf32_gemms = 0
        #: id(tensor) -> (weak reference, data_ptr, version, shape, dtype) of every tensor already judged by
        #: value: a later scan re-judges only tensors that are new or were written since (cheap repeat scans)
        self.judged: dict[int, tuple[Any, ...]] = {}
        #: (what to say if quantized, grid sample) queued by the dispatch observer, read by ``settle``
        self.pending: list[tuple[str, Any]] = []
        #: seconds spent scanning modules and reading queued samples (the dispatch mode's per-op work aside)
        self.scan_s = 0.0
        #: every module a scan found or a registration hook saw since (``watch_modules``), weakly held
        self.known: Any = weakref.WeakSet()
        #: the project's root (resolved): its own modules' globals are scanned too (None: not scanned)
        self.project: Any = None
        #: module file -> whether it is one of the project's own (``scan_project_globals``)
        self.project_files: dict[str, bool] = {}
        self.watching: list[Any] = []

    def add(self, text: str) -> None:
        if text not in self.items and len(self.items) < 50:
            self.items.append(text)

    def settle(self) -> None:
        """Judge the queued GEMM weight samples (outside the candidate's calls: no sync inside them)."""
        pending, self.pending = self.pending, []
        if pending:
            for label, why in read_samples(pending):
                if why:
                    self.add(f"{label}: {why}")

    def unchanged(self, tensor: Any) -> bool:
        """Whether ``tensor`` was judged before and has not been written or re-pointed since."""
        seen = self.judged.get(id(tensor))
        return seen is not None and seen[0]() is tensor and seen[1:] == _identity(tensor)

    def remember(self, tensor: Any) -> None:
        try:
            self.judged[id(tensor)] = (weakref.ref(tensor), *_identity(tensor))
        except TypeError:  # a tensor subclass without weak references: judged again next time
            pass


def _identity(tensor: Any) -> tuple[Any, ...]:
    """What changes when a tensor's values may have: storage address, in-place version, shape, dtype."""
    try:
        version = tensor._version
    except RuntimeError:  # an inference tensor has no version counter: never treated as unchanged
        version = object()
    try:
        pointer = tensor.data_ptr()
    except RuntimeError:  # a tensor without storage (a subclass wrapper): judged by its type only
        pointer = None
    return pointer, version, tuple(tensor.shape), tensor.dtype


def make_observer(evidence: _Evidence) -> Any:
    """A dispatch mode feeding ``evidence`` (built lazily: importing this module imports no torch mode).

    The per-op work is kept small (a sampling loop outside a CUDA graph dispatches tens of thousands of
    ops): dtypes are compared as objects, an op's name and kind are looked up once per op overload, and
    the capture check runs only before the one step that reads values."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    low_float = frozenset(getattr(torch, n) for n in dir(torch) if n.startswith(FLOAT_LOW_BIT)
                          and isinstance(getattr(torch, n), torch.dtype))
    Tensor = torch.Tensor
    kinds: dict[Any, tuple[str, bool]] = {}
    seen_weights: set[tuple] = set()

    def kind(func: Any) -> tuple[str, bool]:
        known = kinds.get(func)
        if known is None:
            name = func._schema.name.split("::")[-1]
            known = kinds[func] = (name, name in GEMM_OPS)
        return known

    float32 = torch.float32
    matmul_flags = torch.backends.cuda.matmul
    cudnn_flags = torch.backends.cudnn

    def tf32_allowed(name: str) -> bool:
        return bool(cudnn_flags.allow_tf32) if name in CONV_OPS else bool(matmul_flags.allow_tf32)

    def tensors_in(value: Any, into: list[Any]) -> None:
        if isinstance(value, Tensor):
            into.append(value)
        elif isinstance(value, (list, tuple)):
            for item in value:
                tensors_in(item, into)
        elif isinstance(value, dict):
            for item in value.values():
                tensors_in(item, into)

    def see(func: Any, args: Any, kwargs: Any, out: Any) -> None:
        evidence.ops += 1
        name, gemm = kind(func)
        operands: list[Any] = []
        tensors_in(args, operands)
        if kwargs:
            tensors_in(kwargs, operands)
        results: list[Any] = []
        tensors_in(out, results)
        for t in operands + results:
            if t.dtype in low_float:
                evidence.add(f"op {name} on a {_dtype(t)} tensor")
        if not gemm:
            if operands and results and results[0].is_floating_point():
                dequantized(name, operands)
                if name == "round":
                    rounded(results[0])
            return
        evidence.gemms += 1
        for t in operands:
            if not t.is_floating_point() and t.dtype is not torch.bool:
                evidence.add(f"{name} with a {_dtype(t)} operand")
        if operands and operands[0].dtype is float32 and operands[0].is_cuda and tf32_allowed(name):
            evidence.tf32_gemms += 1
        weight = operands[2] if name in ("addmm", "baddbmm") and len(operands) > 2 else (
            operands[1] if len(operands) > 1 else None)
        if weight is None or not weight.is_floating_point():
            return
        key = (weight.data_ptr(), tuple(weight.shape), weight.dtype)
        if key in seen_weights:
            return
        if weight.is_cuda and torch.cuda.is_current_stream_capturing():
            return  # sampling values here would add to the graph; the replayed graph's weights are scanned
        seen_weights.add(key)
        sample = grid_sample(weight)  # queued on the stream; read after the call (``Evidence.settle``)
        if sample is not None:
            evidence.pending.append((f"{name} weight {tuple(weight.shape)} {_dtype(weight)}", sample))

    int8, uint8 = torch.int8, torch.uint8
    seen_ints: set[tuple] = set()

    def dequantized(name: str, operands: list[Any]) -> None:
        """An int8 tensor (or a 2-D uint8 one: an image is not a weight) turned into floats by any op: a weight
        dequantized on the fly, wherever the candidate kept it (a closure, a global, a list). Its values are
        judged after the call: a 0/1 mask is no evidence."""
        for t in operands:
            if (t.dtype is int8 or (t.dtype is uint8 and t.dim() == 2)) and t.dim() >= 2 \
                    and t.numel() >= MIN_GRID_ELEMENTS:
                key = (t.data_ptr(), tuple(t.shape), t.dtype)
                if key in seen_ints or (t.is_cuda and torch.cuda.is_current_stream_capturing()):
                    continue
                seen_ints.add(key)
                sample = grid_sample(t.detach().reshape(-1)[:MIN_GRID_ELEMENTS].to(torch.float32))
                if sample is not None:
                    evidence.pending.append((f"{name} turns {_dtype(t)} {tuple(t.shape)} into floats", sample))

    def rounded(result: Any) -> None:
        """Floats rounded to signed integer levels (``torch.round(w / s)``, an fp8 or int8 cast emulated in
        float): quantization, whether of weights or activations. Only a result that holds negative values is
        evidence (an image rounded to 0..255 before its uint8 cast is none); judged after the call."""
        if result.dim() < 2 or result.numel() < MIN_GRID_ELEMENTS:
            return
        key = (result.data_ptr(), tuple(result.shape), result.dtype)
        if key in seen_ints or (result.is_cuda and torch.cuda.is_current_stream_capturing()):
            return
        seen_ints.add(key)
        sample = grid_sample(result)
        if sample is not None:  # all zeros (no evidence) unless some value is negative: no read inside the call
            evidence.pending.append((f"round to signed integer levels {tuple(result.shape)}",
                                     sample * (sample.amin() < 0)))

    class DispatchObserver(TorchDispatchMode):
        @classmethod
        def ignore_compile_internals(cls) -> bool:  # torch.compile runs as compiled under observation
            return True

    def dispatch(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        try:
            see(func, args, kwargs, out)
        except Exception:  # observation must never change what the candidate computes
            pass
        return out

    # set after the class exists: not wrapped in torch._disable_dynamo, whose first call imports dynamo
    # (seconds); with ignore_compile_internals compiled code runs as compiled anyway
    DispatchObserver.__torch_dispatch__ = dispatch
    return DispatchObserver()


def _module_types(torch: Any) -> frozenset[type]:
    """``nn.Module`` and every subclass alive now (matched by exact type: no ``isinstance`` on arbitrary
    objects, whose ``__class__`` may be a property with side effects)."""
    found: set[type] = set()
    stack = [torch.nn.Module]
    while stack:
        cls = stack.pop()
        if cls in found:
            continue
        found.add(cls)
        try:
            stack.extend(type.__subclasses__(cls))
        except TypeError:
            pass
    return frozenset(found)


def watch_modules(evidence: _Evidence) -> None:
    """Keep ``evidence.known`` up to date between full scans: torch's global registration hooks see every
    module that registers a parameter, buffer or submodule (construction, ``from_pretrained``, a module
    swapped in by a quantizer). What they cannot see (a deep copy, an object built around ``__init__``) the
    full scans find: the first, the last test's and the session's end."""
    from torch.nn.modules import module as nn_module

    if evidence.watching:
        return
    known = evidence.known

    def registered(module: Any, name: str, value: Any) -> None:
        known.add(module)
        if isinstance(value, nn_module.Module):
            known.add(value)

    evidence.watching = [nn_module.register_module_parameter_registration_hook(registered),
                         nn_module.register_module_buffer_registration_hook(registered),
                         nn_module.register_module_module_registration_hook(registered)]


def scan_modules(evidence: _Evidence, *, full: bool = True) -> int:
    """Inspect live ``nn.Module`` objects; returns how many were scanned. ``full`` finds every one through
    the garbage collector (about 0.1 s per 400k objects); otherwise the ones ``watch_modules`` knows.
    Tensors judged before and not written since are not read again."""
    import time

    import torch

    started = time.perf_counter()
    if full or not evidence.watching:
        types = _module_types(torch)
        every = gc.get_objects()
        objects = list(compress(every, map(types.__contains__, map(type, every))))  # a C loop over every object
        del every
        for obj in objects:
            evidence.known.add(obj)
    else:
        objects = list(evidence.known)
    count = 0
    for obj in objects:
        count += 1
        cls = type(obj)
        qualified = f"{cls.__module__}.{cls.__qualname__}"
        if "quantiz" in qualified.lower() or cls.__module__.startswith(("torchao", "bitsandbytes", "optimum.quanto",
                                                                          "auto_gptq", "awq", "torch.ao.nn.quantized")):
            evidence.add(f"module {qualified}")
        named = list(obj.named_parameters(recurse=False)) + list(obj.named_buffers(recurse=False))
        for key, tensor in named:
            _judge_value(evidence, f"{cls.__qualname__}.{key}", tensor, torch, registered=True)
        own = _module_own_attributes(torch)
        for key, value in vars(obj).items():
            if key not in own:  # an underscore name, a list or a numpy array holds weights as well as a buffer
                _judge_value(evidence, f"{cls.__qualname__}.{key}", value, torch, containers=True,
                             registered=isinstance(value, torch.Tensor) and not key.startswith("_"))
    if full:
        scan_project_globals(evidence, torch)
    evidence.settle()
    evidence.scan_s += time.perf_counter() - started
    return count


_OWN: list[frozenset[str]] = []


def _module_own_attributes(torch: Any) -> frozenset[str]:
    """The attributes every ``nn.Module`` has (its parameter, buffer and hook dictionaries): not scanned."""
    if not _OWN:
        _OWN.append(frozenset(vars(torch.nn.Module())) | {"training"})
    return _OWN[0]


#: how many items of a list, tuple or dict attribute are judged (weights in a container are few and large)
CONTAINER_ITEMS = 64


def _judge_value(evidence: _Evidence, where: str, value: Any, torch: Any, *, containers: bool = False,
                 registered: bool = False) -> None:
    """Judge a tensor, a numpy array, a long list of small ints, or (``containers``) the items of a list, tuple
    or dict: wherever a candidate keeps its weights, beside or away from a module's parameters. Floats away from
    a module's parameters, buffers and plain tensor attributes (not ``registered``) are a grid only where they
    take both signs: a coordinate table or an image kept there (k/255) is on a grid too, and is no weight."""
    if isinstance(value, torch.Tensor):
        if not evidence.unchanged(value):
            _judge_tensor(evidence, where, value, signed_grid=not registered)
            evidence.remember(value)
    elif type(value).__module__ == "numpy" and hasattr(value, "dtype") and getattr(value, "ndim", 0) >= 2:
        _judge_array(evidence, where, value, torch)
    elif isinstance(value, (list, tuple)) and len(value) >= MIN_GRID_ELEMENTS and all(
            type(v) is int for v in value[:MIN_GRID_ELEMENTS]):
        head = value[:MIN_GRID_ELEMENTS]
        lo, hi = min(head), max(head)
        if -128 <= lo and hi <= 255 and (lo < 0 or hi > 1):
            evidence.add(f"{where} is a list of {len(value)} ints in [{lo}, {hi}] (low-bit weights)")
    elif containers and isinstance(value, types.FunctionType):  # weights kept in a closure
        for index, cell in enumerate(value.__closure__ or ()):
            try:
                content = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            _judge_value(evidence, f"{where} closure {index}", content, torch)
    elif containers and isinstance(value, (list, tuple, dict)):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for index, (key, item) in enumerate(items):
            if index >= CONTAINER_ITEMS:
                break
            _judge_value(evidence, f"{where}[{key!r}]", item, torch)


def _judge_array(evidence: _Evidence, where: str, array: Any, torch: Any) -> None:
    """A numpy array as a tensor of its values (int8 values are quantized weights wherever they live)."""
    if array.size < 64 or str(array.dtype) not in ("int8", "uint8", "int32", "float16", "float32", "float64") or (
            str(array.dtype) == "uint8" and array.ndim != 2):  # an image (H, W, C) is not a weight
        return
    try:
        tensor = torch.from_numpy(array.reshape(-1)[:1 << 16].copy()).reshape(1, -1)
    except (TypeError, ValueError, RuntimeError):
        return
    _judge_tensor(evidence, f"{where} (a numpy array of shape {tuple(array.shape)})", tensor, signed_grid=True)


def scan_project_globals(evidence: _Evidence, torch: Any) -> None:
    """The module-level values of the project's own modules (``evidence.project``; not its tests, not the plugin,
    not an environment inside it), and the closures of their functions: weights quantized at import time and
    kept outside every ``nn.Module``."""
    import sys

    root = evidence.project
    if root is None:
        return
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if not file or name.startswith("pytest_ditgate"):
            continue
        mine = evidence.project_files.get(file)
        if mine is None:  # resolved once per file: a few thousand modules, three full scans
            mine = evidence.project_files[file] = _project_file(root, file)
        if not mine:
            continue
        for key, value in list(vars(module).items()):
            if key.startswith("__"):
                continue
            _judge_value(evidence, f"{name}.{key}", value, torch, containers=True)


def _project_file(root: Any, file: str) -> bool:
    """Whether ``file`` is one of the project's own modules (a test file or conftest aside)."""
    from pathlib import Path

    path = Path(file)
    try:
        parts = path.resolve().relative_to(root).parts
    except (ValueError, OSError):
        return False
    if any(p.startswith(".") or p in ("site-packages", "__pycache__") for p in parts[:-1]):
        return False
    return not (path.name.startswith("test_") or path.name == "conftest.py")


def _judge_tensor(evidence: _Evidence, where: str, tensor: Any, *, signed_grid: bool = False) -> None:
    """Quantization evidence of one tensor: its type or dtype, 8-bit or packed values, or (queued) float values on
    a grid; ``signed_grid``: a grid counts only where the sampled values take both signs."""
    dtype = _dtype(tensor)
    type_name = type(tensor).__name__
    if "Quantized" in type_name or "Affine" in type_name or "Float8" in type_name:
        evidence.add(f"{where} is a {type_name}")
        return
    if low_bit_float(dtype) or dtype.startswith(("qint", "quint", "int4", "uint4")):
        evidence.add(f"{where} has dtype {dtype}")
        return
    if tensor.numel() < 64 or tensor.dim() < 2:
        return
    if dtype in ("int8", "uint8"):
        sample = tensor.detach().reshape(-1)[:4096]
        if int(sample.min()) < 0 or int(sample.max()) > 1:  # a 0/1 mask is not quantization
            evidence.add(f"{where} holds {dtype} values (shape {tuple(tensor.shape)})")
    elif dtype == "int32":
        sample = tensor.detach().reshape(-1)[:4096].to(torch_int64())
        if int(sample.abs().max()) >= 1 << 20:  # packed nibbles fill the range; indices do not
            evidence.add(f"{where} looks like packed low-bit weights (int32, shape {tuple(tensor.shape)})")
    elif tensor.is_floating_point() and tensor.numel() >= 4 * CHUNK:
        sample = grid_sample(tensor)
        if sample is not None:
            if signed_grid:  # no read inside a call: a one-signed sample becomes constants, which are no evidence
                sample = sample * ((sample.amin() < 0) & (sample.amax() > 0))
            evidence.pending.append((f"{where} ({dtype}, shape {tuple(tensor.shape)})", sample))


def torch_int64() -> Any:
    import torch

    return torch.int64


Evidence = _Evidence
