"""The plugin's dtype vocabulary: names, short keys, precision order and peak keys. Torch-free.

A dtype is spelt four ways in ditgate, and this module owns each spelling (no other module keeps a table
of them):

* its **name**: torch's, without the ``torch.`` prefix (``"bfloat16"``). Tolerance tables, golden limits,
  manifests and messages use it. :func:`torch_name` strips the prefix; :func:`dtype_name` also accepts
  the common aliases (``"bf16"``, ``"half"``, ``"fp8"``, ...).
* its **contract key** (``"bf16"``, ``"fp8_e4m3"``): what the limit tables of a quality contract are keyed by
  (:data:`CONTRACT_KEYS`; :data:`CONTRACT_KEY_OF` maps a name to its key).
* its **peak key** (``"bf16"``; every fp8 format is ``"fp8"``): what a device profile's ``peaks.tflops`` and a
  ``rated`` range are keyed by (:data:`PEAK_KEYS`; :data:`PEAK_KEY_OF` maps a name, and
  :data:`PEAK_KEY_OF_PROFILER` the name torch's profiler gives an op's input, to its key).
* its **precision rank**: :data:`PRECISION` orders the floating names from most to least precise
  (:func:`least_precise`); :data:`MANTISSA_BITS` gives each floating name (and the ``tf32`` math mode) its
  explicit mantissa bits, the resolution a kernel reading at that precision has.
"""

from __future__ import annotations

from typing import Any, Collection, Iterable

#: aliases :func:`dtype_name` accepts for a name
ALIASES = {"half": "float16", "float": "float32", "double": "float64", "bf16": "bfloat16", "fp16": "float16",
           "fp32": "float32", "fp64": "float64", "fp8": "float8_e4m3fn", "cfloat": "complex64",
           "cdouble": "complex128"}

#: floating names from the most to the least precise
PRECISION = ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")

#: explicit mantissa bits of each floating name and of the ``tf32`` math mode (what a kernel reading its inputs
#: at that precision resolves: values closer together than its rounding grid read the same)
MANTISSA_BITS = {"float64": 52, "complex128": 52, "float32": 23, "complex64": 23, "tf32": 10, "float16": 10,
                 "bfloat16": 7, "float8_e4m3fn": 3, "float8_e4m3fnuz": 3, "float8_e5m2": 2, "float8_e5m2fnuz": 2}

#: name -> contract key, most precise first
CONTRACT_KEY_OF = {"float64": "fp64", "float32": "fp32", "float16": "fp16", "bfloat16": "bf16",
                   "float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2"}
#: the keys a quality contract's limit table may use, in order of decreasing precision (``tf32`` is a math
#: mode, ``int8``/``int4`` are quantized formats: no tensor has those names, a compute dtype may)
CONTRACT_KEYS = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8", "int4")

#: the keys of a device profile's ``peaks.tflops`` (and of a ``rated`` range's dtype), most precise first
PEAK_KEYS = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8")
#: name -> peak key
PEAK_KEY_OF = {"float64": "fp64", "float32": "fp32", "float16": "fp16", "bfloat16": "bf16",
               "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "float8_e4m3fnuz": "fp8", "float8_e5m2fnuz": "fp8"}
#: the profiler's name of an op's input dtype (``event.dtypes()``) -> peak key
PEAK_KEY_OF_PROFILER = {"c10::BFloat16": "bf16", "c10::Half": "fp16", "float": "fp32", "double": "fp64",
                        "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8",
                        "c10::Float8_e5m2fnuz": "fp8"}


def torch_name(dtype: Any) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``; a string comes back as it is (without a ``torch.`` prefix)."""
    return str(dtype).removeprefix("torch.")


def dtype_name(dtype: Any) -> str:
    """``torch.float16``, ``"float16"``, ``"fp16"`` or ``"half"`` -> ``"float16"``."""
    name = torch_name(dtype)
    return ALIASES.get(name, name)


def least_precise(names: Iterable[str], among: Collection[str] = PRECISION) -> str | None:
    """The least precise of ``names`` that :data:`PRECISION` ranks and ``among`` holds; None when there is none."""
    ranked = [name for name in names if name in PRECISION and name in among]
    return max(ranked, key=PRECISION.index) if ranked else None
