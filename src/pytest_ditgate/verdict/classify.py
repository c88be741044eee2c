"""Experiment classification is checked, not trusted.

A candidate whose modules or weights hold low-bit dtypes or known quantization classes is judged as
``quantization`` whatever it claims; one whose sampling differs from the frozen corpus in any setting both
sides state (step count, scheduler, guidance; and what a gate suite recorded as executed: timesteps, guided
calls, blocks per call, ...) is at least ``approximate``. A stricter claim than the evidence is kept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from pytest_ditgate.dtypes import torch_name
from pytest_ditgate.quality.specs import EXPERIMENT_CLASSES

LOW_BIT_DTYPES = frozenset({
    "int8", "uint8", "int4", "uint4", "qint8", "quint8", "qint32", "quint4x2", "quint2x4",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2",
})
QUANT_CLASS_NAMES = re.compile(
    r"(Linear8bitLt|Linear4bit|Params4bit|Int8Params|QuantizedLinear|QLinear|FP8Linear|Float8Linear|"
    r"Int8WeightOnly|Int4WeightOnly|AffineQuantized|QuantStub|DeQuantStub|FakeQuantize|Quantized)"
)
QUANT_MODULE_PREFIXES = ("torch.ao.nn.quantized", "torch.ao.nn.qat", "torch.nn.quantized", "bitsandbytes",
                         "torchao", "optimum.quanto", "auto_gptq", "awq", "transformer_engine")
SAMPLING_KEYS = ("num_steps", "scheduler", "guidance_scale")


@dataclass(frozen=True)
class Classification:
    declared: str
    effective: str
    evidence: tuple[str, ...] = field(default_factory=tuple)

    @property
    def overridden(self) -> bool:
        return self.effective != self.declared


def _is_mask(tensor: Any) -> bool:
    """An int8/uint8 tensor holding only 0 and 1 is a mask, not quantized weights."""
    if torch_name(tensor.dtype) not in ("int8", "uint8") or tensor.numel() == 0:
        return False
    return int(tensor.min()) >= 0 and int(tensor.max()) <= 1


def quantization_evidence(modules: Iterable[Any] = (), state_dicts: Iterable[Mapping[str, Any]] = ()) -> list[str]:
    """What in the candidate's modules or weights looks quantized (empty: nothing)."""
    evidence: list[str] = []
    for root in modules:
        for name, module in root.named_modules():
            cls = type(module)
            qualified = f"{cls.__module__}.{cls.__qualname__}"
            if QUANT_CLASS_NAMES.search(cls.__qualname__) or cls.__module__.startswith(QUANT_MODULE_PREFIXES):
                evidence.append(f"module {name or '<root>'} is {qualified}")
        for name, tensor in list(root.named_parameters()) + list(root.named_buffers()):
            if torch_name(tensor.dtype) in LOW_BIT_DTYPES and not _is_mask(tensor):
                evidence.append(f"tensor {name} has dtype {torch_name(tensor.dtype)}")
    for state in state_dicts:
        for name, tensor in state.items():
            dtype = getattr(tensor, "dtype", None)
            if dtype is not None and torch_name(dtype) in LOW_BIT_DTYPES:
                evidence.append(f"weight {name} has dtype {torch_name(dtype)}")
    return evidence


def approximation_evidence(used: Mapping[str, Any], frozen: Mapping[str, Any]) -> list[str]:
    """Sampling settings the candidate used (or executed) that differ from the frozen corpus's: every key both
    mappings hold, the usual ones (``SAMPLING_KEYS``) first."""
    keys = [k for k in SAMPLING_KEYS if k in used] + sorted(k for k in used if k not in SAMPLING_KEYS)
    return [f"{key} {_short(frozen[key])} -> {_short(used[key])}" for key in keys
            if key in frozen and used[key] != frozen[key]]


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def classify(declared: str, *, quantization: Iterable[str] = (), approximation: Iterable[str] = ()) -> Classification:
    """The class the candidate is judged as: the strictest of its claim and the evidence."""
    if declared not in EXPERIMENT_CLASSES:
        raise ValueError(f"unknown experiment class {declared!r}; choose from {', '.join(EXPERIMENT_CLASSES)}")
    quantization, approximation = list(quantization), list(approximation)
    effective = declared
    if approximation and EXPERIMENT_CLASSES.index(effective) < EXPERIMENT_CLASSES.index("approximate"):
        effective = "approximate"
    if quantization:
        effective = "quantization"
    return Classification(declared, effective, tuple(quantization + approximation))


def classify_tagged(declared: str, evidence: Iterable[str]) -> Classification:
    """:func:`classify` from evidence tagged ``quant: ...`` / ``approx: ...`` (as it travels on test reports)."""
    evidence = list(evidence)
    return classify(declared, quantization=[e for e in evidence if e.startswith("quant:")],
                    approximation=[e for e in evidence if e.startswith("approx:")])
