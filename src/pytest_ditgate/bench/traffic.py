"""Estimated device-memory traffic of a torch op from the shapes the profiler recorded (``record_shapes``).

Memory-bound kernels are judged in GB/s, so their bytes must come from somewhere: a kernel's launching op
(its ``External id``) carries ``Input Dims``/``Input type``/``Input Strides`` in the exported trace. Rules
(docs/profiling.md): every tensor input is read once (broadcast dims, stride 0, count once); the output is
written once, as large as the largest input, except

- GEMMs (``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``mv``, ``addmv``): ``a[..., K] @ b[K, N]`` writes ``[..., N]``;
- in-place ops (``aten::add_``): the first input is read and written; ``copy_``/``fill_``/``zero_`` only
  write it;
- reductions (``sum``, ``mean``, ``amax``, ...): the output is negligible.

None when an input's size cannot be known (a tensor list, an unknown dtype): no number is invented.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

#: bytes per element of the profiler's input type names
ELEMENT_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4,
                 "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1, "c10::complex<float>": 8,
                 "c10::complex<double>": 16, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
                 "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1, "c10::Float8_e8m0fnu": 1}
#: input types that are not tensors and move no device memory worth counting ("" is a None argument)
NOT_TENSORS = frozenset({"", "Scalar", "ScalarList", "Device", "Layout", "MemoryFormat", "ScalarType", "string"})
GEMMS = frozenset({"mm", "addmm", "bmm", "baddbmm", "mv", "addmv", "_addmm_activation"})
WRITE_ONLY = frozenset({"copy_", "fill_", "zero_", "normal_", "uniform_", "random_", "bernoulli_", "index_put_"})
REDUCTIONS = frozenset({"sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "var", "std", "var_mean",
                        "std_mean", "prod", "any", "all", "norm", "linalg_vector_norm", "logsumexp"})


def _distinct_elements(dims: Any, strides: Any) -> int | None:
    """Elements one tensor really holds: a broadcast dim (stride 0) counts once."""
    if not isinstance(dims, list) or not all(isinstance(d, int) and d >= 0 for d in dims):
        return None
    if isinstance(strides, list) and len(strides) == len(dims) and all(isinstance(s, int) for s in strides):
        return math.prod(d for d, s in zip(dims, strides) if s != 0)
    return math.prod(dims)


def op_bytes(name: str, args: Mapping[str, Any]) -> int | None:
    """Estimated bytes read plus written by op ``name`` (``aten::gelu``) from its trace ``args``; None
    when they cannot be known."""
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not isinstance(types, list) or len(dims) != len(types):
        return None
    strides = args.get("Input Strides")
    strides = strides if isinstance(strides, list) and len(strides) == len(dims) else [None] * len(dims)
    tensors: list[tuple[int, int, list[int]]] = []  # (bytes, element size, dims)
    for shape, kind, stride in zip(dims, types, strides):
        if kind in NOT_TENSORS:
            continue
        size = ELEMENT_BYTES.get(kind) if isinstance(kind, str) else None
        count = _distinct_elements(shape, stride)
        if size is None or count is None:
            return None
        tensors.append((count * size, size, shape))
    if not tensors:
        return None
    op = name.split("::")[-1]
    read = sum(t[0] for t in tensors)
    if op in WRITE_ONLY:
        return read
    if op.endswith("_"):
        return read + tensors[0][0]
    if op in REDUCTIONS:
        return read
    if op in GEMMS and len(tensors) >= 2 and tensors[-2][2] and tensors[-1][2]:
        (_, size, a), (_, _, b) = tensors[-2], tensors[-1]
        return read + math.prod(a[:-1]) * (b[-1] if len(b) >= 2 else 1) * size
    return read + max(t[0] for t in tensors)
