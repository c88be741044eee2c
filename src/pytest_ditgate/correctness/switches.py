"""The device libraries' reduced-precision switches: which were on while the candidate ran, and their effect.

On CUDA four switches let torch's library kernels compute below the inputs' precision:

- ``torch.backends.cuda.matmul.allow_tf32``: float32 GEMMs on TF32 tensor cores (10-bit operands);
- ``torch.backends.cudnn.allow_tf32``: float32 convolutions likewise (on by default);
- ``torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction`` and
  ``allow_bf16_reduced_precision_reduction``: fp16/bf16 GEMMs may add partial sums in fp16/bf16 (on by
  default).

TF32 reads float32 operands at 10 bits, which the precision probe's moves cannot be seen at, so the probe
catches it wherever the GEMM decides the output. A reduction in bf16 reads its inputs in full, so no input
move shows it: ``check_kernel`` records which switches were on during the candidate's calls (before and
after each call, and at each GEMM and convolution of the probe's call through :class:`Watch`), and where one
was on for a CUDA GEMM or convolution of its dtype and ``compute_dtype`` does not declare that precision, it
runs the candidate once more with every switch forced off (:class:`ForcedOff`, at each op, so a candidate
that sets a switch itself is overruled too) and compares. On a CPU they change nothing: they are recorded
and the report says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pytest_ditgate.dtypes import MANTISSA_BITS, dtype_name

#: (switch, the input dtype whose GEMMs or convolutions it affects, the precision it computes at, what it does)
SWITCHES: tuple[tuple[str, str, str, str], ...] = (
    ("torch.backends.cuda.matmul.allow_tf32", "float32", "tf32", "float32 GEMMs on TF32 tensor cores"),
    ("torch.backends.cudnn.allow_tf32", "float32", "tf32", "float32 convolutions on TF32 tensor cores"),
    ("torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction", "float16", "float16",
     "fp16 GEMMs may add partial sums in fp16"),
    ("torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction", "bfloat16", "bfloat16",
     "bf16 GEMMs may add partial sums in bf16"),
)

#: aten ops (overload packet names) that run a GEMM or a convolution through the device libraries
GEMMS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "matmul", "linear", "_addmm_activation"})
CONVOLUTIONS = frozenset({"convolution", "_convolution", "cudnn_convolution", "cudnn_convolution_transpose",
                          "convolution_overrideable", "conv2d", "conv1d", "conv3d"})


def read() -> dict[str, bool]:
    """Each switch's state now (the newer ``fp32_precision`` settings read as TF32 where they say so)."""
    import torch

    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    try:
        tf32 = (bool(matmul.allow_tf32), bool(cudnn.allow_tf32))
    except RuntimeError:  # the newer API set some flags: the legacy ones cannot be read
        tf32 = (matmul.fp32_precision == "tf32", cudnn.conv.fp32_precision == "tf32")
    return dict(zip((name for name, *_ in SWITCHES), (*tf32, bool(matmul.allow_fp16_reduced_precision_reduction),
                                                      bool(matmul.allow_bf16_reduced_precision_reduction))))


def covered(switch: str, compute_dtype: Any) -> bool:
    """Whether the declared ``compute_dtype`` claims the precision ``switch`` computes at (or a coarser one)."""
    if compute_dtype is None:
        return False
    precision = next(p for name, _, p, _ in SWITCHES if name == switch)
    declared = MANTISSA_BITS.get(dtype_name(compute_dtype))
    return declared is not None and declared <= MANTISSA_BITS[precision]


@dataclass
class SwitchRecord:
    """One switch over the check: ``on`` (during any candidate call), the device GEMMs/convolutions of its
    dtype that ran with it on (``ops``, seen in the probe's call), and what it did (``effect``)."""

    name: str
    on: bool = False
    ops: int = 0
    effect: str = "off"

    def line(self) -> str:
        return f"{self.name.removeprefix('torch.backends.')}={'on' if self.on else 'off'}: {self.effect}"


@dataclass
class Switches:
    """Every switch's record over one check."""

    records: dict[str, SwitchRecord] = field(default_factory=lambda: {name: SwitchRecord(name)
                                                                      for name, *_ in SWITCHES})

    def note(self, states: dict[str, bool]) -> None:
        """A snapshot of the states (before or after a candidate call)."""
        for name, on in states.items():
            self.records[name].on |= on

    def lines(self) -> list[str]:
        return [record.line() for record in self.records.values()]


def library_device(tensor: Any) -> bool:
    """Whether the switches act on library ops over ``tensor``: a CUDA tensor (on a CPU they change nothing)."""
    return bool(tensor.is_cuda)


def _relevant(func: Any, dtypes: set[str], on_device: bool) -> list[str]:
    """The switches an op with these input dtypes could use, when it is a device GEMM or convolution."""
    op = func.overloadpacket.__name__
    if not on_device or (op not in GEMMS and op not in CONVOLUTIONS):
        return []
    names = []
    for name, dtype, _, _ in SWITCHES:
        if dtype in dtypes and (("cudnn" in name) == (op in CONVOLUTIONS)):
            names.append(name)
    return names


def _watch_class() -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Watch(TorchDispatchMode):
        """While active, counts per switch the CUDA GEMMs and convolutions of its dtype that ran with it on."""

        @classmethod
        def ignore_compile_internals(cls) -> bool:
            return True

        def __init__(self) -> None:
            super().__init__()
            self.ops: dict[str, int] = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's signature
            tensors = _tensors(args, kwargs)
            names = _relevant(func, {dtype_name(t.dtype) for t in tensors}, any(library_device(t) for t in tensors))
            if names:
                states = read()
                for name in names:
                    if states[name]:
                        self.ops[name] = self.ops.get(name, 0) + 1
            return func(*args, **(kwargs or {}))

    return Watch


def _forced_class() -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    from pytest_ditgate.correctness import honest

    class ForcedOff(TorchDispatchMode):
        """While active, all four switches are off, and every op runs with them off whatever the candidate
        set before it (restored after the op): the candidate as it computes without them."""

        @classmethod
        def ignore_compile_internals(cls) -> bool:
            return True

        def __enter__(self) -> Any:
            self._flags = honest.candidate_precision(tf32=False, reduced_precision_reduction=False)
            self._flags.__enter__()
            return super().__enter__()

        def __exit__(self, *exc: Any) -> Any:
            try:
                return super().__exit__(*exc)
            finally:
                self._flags.__exit__(*exc)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's signature
            with honest.candidate_precision(tf32=False, reduced_precision_reduction=False):
                return func(*args, **(kwargs or {}))

    return ForcedOff


def watch() -> Any:
    """A new :class:`Watch` dispatch mode."""
    return _watch_class()()


def forced_off(dispatch: bool = True) -> Any:
    """A new :class:`ForcedOff` dispatch mode; with ``dispatch=False`` (a compiled candidate, which a dispatch mode
    would run eagerly) only the switches set off around the call."""
    if not dispatch:
        from pytest_ditgate.correctness import honest

        return honest.candidate_precision(tf32=False, reduced_precision_reduction=False)
    return _forced_class()()


def _tensors(args: Any, kwargs: Any) -> list[Any]:
    import torch
    from torch.utils._pytree import tree_flatten

    return [t for t in tree_flatten((args, kwargs or {}))[0] if isinstance(t, torch.Tensor)]
