"""The object the ``golden`` fixture gives a test: ``load`` and ``check`` bound to that test."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from pytest_ditgate.arguments import describe, is_torch_tensor, require_callable, type_name
from pytest_ditgate.errors import DitgateUsageError
from pytest_ditgate.golden.keys import CPU_KEY, is_machine_key, machine_key, validate_key

if TYPE_CHECKING:
    import torch

    from pytest_ditgate.golden.session import GoldenHit, GoldenResult, GoldenSession


def device_key(device: Any = None, tensors: Mapping[str, Any] | None = None) -> str:
    """The golden key for where tensors were computed.

    ``device`` may be a key (``"sm_90"``, ``"cpu"``), a ``torch.device`` or a device string
    (``"cuda:0"``); without it the key comes from the tensors: any CUDA tensor gives that GPU's arch,
    otherwise ``cpu``. Pass ``device`` when the tensors were moved to the CPU before the check.
    """
    if isinstance(device, str) and (device.startswith(CPU_KEY) or device.startswith("sm_")):
        return validate_key(device)
    if device is None:
        cuda = [t.device for t in (tensors or {}).values() if getattr(getattr(t, "device", None), "type", "") == "cuda"]
        if not cuda:
            return CPU_KEY
        device = cuda[0]
    import torch

    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise DitgateUsageError(f"golden: device={describe(device)}: give a golden key ('cpu', 'sm_90'), a "
                                "torch.device or a device string like 'cuda:0'") from None
    if device.type != "cuda":
        return CPU_KEY
    from pytest_ditgate.device_info import arch_label

    return arch_label(torch.cuda.get_device_capability(device))


def resolved_key(call: str, device: Any, tensors: Mapping[str, Any] | None = None) -> str:
    """:func:`device_key`, with a device this machine does not have (``"cuda"`` on a machine without a GPU,
    ``"cuda:3"`` beside one GPU) as a usage error naming the call, not torch's traceback."""
    try:
        return device_key(device, tensors)
    except DitgateUsageError as exc:
        raise DitgateUsageError(f"{call}: {exc}") from None
    except (RuntimeError, AssertionError, ValueError) as exc:
        shown = describe(device) if device is not None else "the tensors' device"
        raise DitgateUsageError(f"{call}: device={shown} is not a device of this machine ({str(exc).strip()}); give "
                                "the device the tensors were computed on, or a golden key ('cpu', 'sm_90')") from None


def machine_fingerprint(device: Any = "cpu") -> str:
    """What decides bitwise results on this machine for ``device``: the text behind its machine key."""
    import platform

    import torch

    from pytest_ditgate.device_info import arch_label
    from pytest_ditgate.toolchain import package_version

    device = torch.device(device)
    parts = [f"torch {torch.__version__}", f"diffusers {package_version('diffusers')}"]
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        parts += [props.name, arch_label((props.major, props.minor)), f"{props.multi_processor_count} SMs",
                  f"CUDA {torch.version.cuda}", f"cuDNN {torch.backends.cudnn.version()}"]
    else:
        parts += [platform.machine(), _cpu_model(), f"ISA {torch.backends.cpu.get_cpu_capability()}",
                  f"{torch.get_num_threads()} threads"]
    return "; ".join(parts)


def _cpu_model() -> str:
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


@dataclass(repr=False)
class Golden:
    """Golden lookups for one test: ``load(name)`` and ``check(name, tensors)``."""

    session: "GoldenSession"
    nodeid: str
    fingerprints: dict[str, str] = field(default_factory=dict)  # machine key -> what it stands for
    #: the run's hooks (``pytest_ditgate_golden_check``); None outside a pytest run
    hook: Any = None

    def __repr__(self) -> str:  # pytest prints the fixture beside a failing test: keep it one short line
        return f"<golden fixture: {self.session.mode} mode, store {self.session.store.root}>"

    @property
    def mode(self) -> str:
        return self.session.mode

    def load(self, name: str, *, device: Any = "cpu") -> "GoldenHit":
        """The golden ``name`` for ``device`` (a key or torch device), following the fallback chain."""
        __tracebackhide__ = True
        return self.session.lookup(name, resolved_key(f"golden.load({name!r})", device), nodeid=self.nodeid)

    def machine_key(self, device: Any = "cpu") -> str:
        """The key of goldens frozen on THIS machine for ``device`` (for bitwise claims; no fallback)."""
        key = resolved_key("golden.machine_key", device)
        fingerprint = machine_fingerprint(device)
        key = machine_key(key, fingerprint)
        self.fingerprints[key] = fingerprint
        return key

    def check(self, name: str, tensors: Mapping[str, "torch.Tensor"], *, device: Any = None,
              compare: Callable[[Mapping[str, Any], "GoldenHit"], Any] | None = None,
              metadata: Mapping[str, Any] | None = None, optional: Iterable[str] = (),
              quality_inputs: Mapping[str, Any] | None = None, frozen_with: Iterable[str] = (),
              allow_dtype_change: bool = False) -> "GoldenResult":
        """Compare ``tensors`` with golden ``name``; raises ``GateFailure`` on a mismatch or missing golden.

        ``compare(candidate, hit)`` replaces the default :class:`TensorComparator`; under
        ``--ditgate-freeze`` a missing golden is queued for writing instead (``--ditgate-refreeze``: always).
        ``optional``: glob patterns of golden tensors that are diagnostics (``"block*"``): a candidate that
        cannot produce them is judged on the others, and the result and summary name what was not compared.
        Every other golden tensor is required. ``device`` may also be a machine key (:meth:`machine_key`).
        ``quality_inputs``: what ``compare`` judges the tensors with beyond them (``kinds``, ``labels`` of
        ``quality_gate.check``), frozen with the golden for ``ditgate experiment``'s judge, which re-judges out of
        process; a check giving other ones than were frozen fails (``golden_stale``). ``frozen_with``: keys of
        ``metadata`` that make the golden this test's baseline (weights, seed, steps); a golden frozen with
        other values there fails as ``golden_stale`` too, naming them, rather than as a mismatch.
        ``allow_dtype_change``: the default comparator judges a tensor whose dtype differs from the golden's (a
        bf16 candidate against a float32 golden) at the coarser dtype's limits; without it a dtype change fails.
        """
        __tracebackhide__ = True
        check_arguments(name, tensors, compare=compare, metadata=metadata, optional=optional,
                        quality_inputs=quality_inputs, frozen_with=frozen_with)
        if not isinstance(allow_dtype_change, bool):
            raise DitgateUsageError(f"golden.check({name!r}, tensors): allow_dtype_change must be True or False, got "
                                    f"{describe(allow_dtype_change)}")
        if allow_dtype_change and compare is not None:
            raise DitgateUsageError(f"golden.check({name!r}, tensors): allow_dtype_change is for the default "
                                    "comparator; a compare= of your own judges dtypes itself")
        key = resolved_key(f"golden.check({name!r}, tensors)", device, tensors)
        if is_machine_key(key) and key in self.fingerprints:
            metadata = {"machine": self.fingerprints[key], **dict(metadata or {})}
        optional = tuple(optional)

        def check() -> "GoldenResult":
            __tracebackhide__ = True
            return self.session.check(name, tensors, key, compare=compare, nodeid=self.nodeid, metadata=metadata,
                                      optional=optional, quality_inputs=quality_inputs,
                                      frozen_with=tuple(frozen_with), allow_dtype_change=allow_dtype_change)

        if self.hook is None:
            return check()
        return self.hook.pytest_ditgate_golden_check(name=name, key=key, tensors=tensors, nodeid=self.nodeid,
                                                     optional=optional, check=check)


def check_arguments(name: Any, tensors: Any, *, compare: Any, metadata: Any, optional: Any, quality_inputs: Any,
                    frozen_with: Any) -> None:
    """``golden.check``'s arguments, before anything is read or queued: a usage error names the argument."""
    call = f"golden.check({name!r}, tensors)"
    if hasattr(tensors, "shape") and hasattr(tensors, "dtype"):
        raise DitgateUsageError(f"{call}: tensors must be a mapping of names to torch tensors, like "
                                f"{{'out': tensor}}; got one {describe(tensors)}")
    if not isinstance(tensors, Mapping):
        raise DitgateUsageError(f"{call}: tensors must be a mapping of names to torch tensors, like "
                                f"{{'out': tensor}}; got {describe(tensors)}")
    for key, value in tensors.items():
        if not isinstance(key, str):
            raise DitgateUsageError(f"{call}: tensor names must be strings, got {describe(key)}")
        if not is_torch_tensor(value):
            hint = " (convert it with torch.from_numpy)" if type_name(value) == "numpy.ndarray" else ""
            raise DitgateUsageError(f"{call}: tensors[{key!r}] is {describe(value)}, not a torch tensor{hint}; "
                                    "golden files hold torch tensors")
        problem = _dataless(value)
        if problem:
            raise DitgateUsageError(f"{call}: tensors[{key!r}] is {problem}; golden files hold the values of dense "
                                    "tensors")
    if compare is not None:
        require_callable(compare, "compare", call, "compare(candidate, hit) -> a result with a boolean passed")
    for argument, value in (("metadata", metadata), ("quality_inputs", quality_inputs)):
        if value is not None and not isinstance(value, Mapping):
            raise DitgateUsageError(f"{call}: {argument} must be a mapping (or None), got {describe(value)}")
    for argument, value in (("optional", optional), ("frozen_with", frozen_with)):
        items = None if isinstance(value, (str, bytes, Mapping)) else _items(value)
        if items is None or not all(isinstance(item, str) for item in items):
            raise DitgateUsageError(f"{call}: {argument} must be a list of strings (like ['seed']), got "
                                    f"{describe(value)}")


def _dataless(tensor: Any) -> str | None:
    """Why ``tensor`` has no values a golden can hold or be compared with (None when it has): a meta tensor, a
    sparse or other non-strided layout."""
    if getattr(tensor, "is_meta", False):
        return f"a meta tensor ({describe(tensor)}): it has a shape and no data"
    layout = str(getattr(tensor, "layout", "torch.strided"))
    if layout != "torch.strided":
        return f"a {layout.removeprefix('torch.')} tensor ({describe(tensor)}): pass tensor.to_dense()"
    return None


def _items(value: Any) -> list[Any] | None:
    try:
        return list(value)
    except TypeError:
        return None

