"""What the candidate's process actually executes, as class evidence (child side; imports torch).

Two views, both recorded to the output folder and judged by the judge:

* :class:`DispatchObserver`, a ``TorchDispatchMode`` active while a test runs (paused while ``ditbench``
  times): every op touching an fp8/fp4/int4 tensor, every GEMM/conv with an integer operand, and GEMM/conv
  weights whose values sit on a low-bit grid (int8 values stored in fp32, dequantized on the fly). It
  lets ``torch.compile`` run as compiled (``ignore_compile_internals``) and does nothing while a CUDA
  graph is being captured.
* :func:`scan_modules`, after each test: every ``nn.Module`` alive in the process (the VAE too, modules
  quantized on their first call too), its parameters, buffers and tensor attributes.

A uint8/bool mask (values 0/1) or an integer index buffer is not quantization.
"""

from __future__ import annotations

import gc
from typing import Any

FLOAT_LOW_BIT = ("float8", "float4")
INT_LOW_BIT = ("int8", "uint8", "int4", "uint4", "qint", "quint")
GEMM_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addmv", "mv", "_int_mm", "_scaled_mm",
                      "convolution", "_convolution", "conv2d", "conv1d", "conv3d", "cudnn_convolution",
                      "_weight_int8pack_mm", "_weight_int4pack_mm", "_weight_int4pack_mm_for_cpu"})
CHUNK = 32
#: weights smaller than this are not judged by their values (filters such as an 11x11 gaussian window
#: repeat values by design; quantized weights worth the name are larger)
MIN_GRID_ELEMENTS = 4096


def _dtype(t: Any) -> str:
    return str(t.dtype).replace("torch.", "")


def low_bit_float(name: str) -> bool:
    return name.startswith(FLOAT_LOW_BIT)


def low_bit_int(name: str) -> bool:
    return name.startswith(INT_LOW_BIT)


def on_low_bit_grid(tensor: Any) -> str | None:
    """Why the values of a float tensor look quantized (sampled chunks of 32 contiguous values), or None."""
    import torch

    if tensor.numel() < MIN_GRID_ELEMENTS or not tensor.is_floating_point() or low_bit_float(_dtype(tensor)):
        return None
    flat = tensor.detach()
    if flat.dim() == 2 and not flat.is_contiguous() and flat.t().is_contiguous():
        flat = flat.t()
    flat = flat.reshape(-1)
    n = flat.numel()
    starts = [0, n // 3, (2 * n) // 3, n - CHUNK]
    chunks = torch.stack([flat[s:s + CHUNK] for s in starts]).to("cpu", torch.float64)
    verdicts = [_chunk_grid(row) for row in chunks]
    if all(verdicts) and len(set(verdicts)) >= 1:
        return verdicts[0]
    return None


def _chunk_grid(row: Any) -> str | None:
    values = sorted(set(row.tolist()))
    if len(values) < 3:
        return None  # constants, zeros, one-hot: not evidence
    if len(values) <= CHUNK // 2:
        return f"{len(values)} distinct values in {CHUNK} (a low-bit codebook)"
    step = min(b - a for a, b in zip(values, values[1:]))
    lo, hi = values[0], values[-1]
    if step <= 0 or (hi - lo) / step > 256:
        return None
    offsets = [(v - lo) / step for v in values]
    if max(abs(o - round(o)) for o in offsets) < 0.02:
        return f"values on a grid of {round((hi - lo) / step) + 1} levels"
    return None


class _Evidence:
    def __init__(self) -> None:
        self.items: list[str] = []
        self.gemms = 0
        self.ops = 0

    def add(self, text: str) -> None:
        if text not in self.items and len(self.items) < 50:
            self.items.append(text)


def make_observer(evidence: _Evidence) -> Any:
    """A dispatch mode feeding ``evidence`` (built lazily: importing this module imports no torch mode)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    seen_weights: set[tuple] = set()

    class DispatchObserver(TorchDispatchMode):
        @classmethod
        def ignore_compile_internals(cls) -> bool:  # torch.compile runs as compiled under observation
            return True


        @staticmethod
        def _see(func: Any, args: Any, kwargs: Any, out: Any) -> None:
            if torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing():
                return
            evidence.ops += 1
            name = func._schema.name.split("::")[-1]
            tensors = [t for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)]
            for t in tensors:
                if low_bit_float(_dtype(t)):
                    evidence.add(f"op {name} on a {_dtype(t)} tensor")
            if name not in GEMM_OPS:
                return
            evidence.gemms += 1
            operands = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            for t in operands:
                if not t.is_floating_point() and _dtype(t) != "bool":
                    evidence.add(f"{name} with a {_dtype(t)} operand")
            weight = operands[2] if name in ("addmm", "baddbmm") and len(operands) > 2 else (
                operands[1] if len(operands) > 1 else None)
            if weight is None or not weight.is_floating_point():
                return
            key = (weight.data_ptr(), tuple(weight.shape), _dtype(weight))
            if key in seen_weights:
                return
            seen_weights.add(key)
            why = on_low_bit_grid(weight)
            if why:
                evidence.add(f"{name} weight {tuple(weight.shape)} {_dtype(weight)}: {why}")

    def dispatch(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        try:
            self._see(func, args, kwargs or {}, out)
        except Exception:  # observation must never change what the candidate computes
            pass
        return out

    # set after the class exists: not wrapped in torch._disable_dynamo, whose first call imports dynamo
    # (seconds); with ignore_compile_internals compiled code runs as compiled anyway
    DispatchObserver.__torch_dispatch__ = dispatch
    return DispatchObserver()


def scan_modules(evidence: _Evidence) -> int:
    """Inspect every live ``nn.Module``; returns how many were scanned."""
    import warnings

    import torch

    count = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        objects = [obj for obj in gc.get_objects() if isinstance(obj, torch.nn.Module)]
    for obj in objects:
        if not isinstance(obj, torch.nn.Module):
            continue
        count += 1
        cls = type(obj)
        qualified = f"{cls.__module__}.{cls.__qualname__}"
        if "quantiz" in qualified.lower() or cls.__module__.startswith(("torchao", "bitsandbytes", "optimum.quanto",
                                                                          "auto_gptq", "awq", "torch.ao.nn.quantized")):
            evidence.add(f"module {qualified}")
        named = list(obj.named_parameters(recurse=False)) + list(obj.named_buffers(recurse=False))
        named += [(k, v) for k, v in vars(obj).items() if isinstance(v, torch.Tensor) and not k.startswith("_")]
        for key, tensor in named:
            _judge_tensor(evidence, f"{cls.__qualname__}.{key}", tensor)
    return count


def _judge_tensor(evidence: _Evidence, where: str, tensor: Any) -> None:
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
        why = on_low_bit_grid(tensor)
        if why:
            evidence.add(f"{where} ({dtype}, shape {tuple(tensor.shape)}): {why}")


def torch_int64() -> Any:
    import torch

    return torch.int64


Evidence = _Evidence
