"""The object the ``golden`` fixture gives a test: ``load`` and ``check`` bound to that test."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

from pytest_ditgate.golden.keys import CPU_KEY, validate_key

if TYPE_CHECKING:
    import torch

    from pytest_ditgate.golden.session import GoldenHit, GoldenResult, GoldenSession


def device_key(device: Any = None, tensors: Mapping[str, Any] | None = None) -> str:
    """The golden key for where tensors were computed.

    ``device`` may be a key (``"sm_90"``, ``"cpu"``), a ``torch.device`` or a device string
    (``"cuda:0"``); without it the key comes from the tensors: any CUDA tensor gives that GPU's arch,
    otherwise ``cpu``. Pass ``device`` when the tensors were moved to the CPU before the check.
    """
    if isinstance(device, str) and (device == CPU_KEY or device.startswith("sm_")):
        return validate_key(device)
    if device is None:
        cuda = [t.device for t in (tensors or {}).values() if getattr(getattr(t, "device", None), "type", "") == "cuda"]
        if not cuda:
            return CPU_KEY
        device = cuda[0]
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return CPU_KEY
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


@dataclass
class Golden:
    """Golden lookups for one test: ``load(name)`` and ``check(name, tensors)``."""

    session: "GoldenSession"
    nodeid: str

    @property
    def mode(self) -> str:
        return self.session.mode

    def load(self, name: str, *, device: Any = "cpu") -> "GoldenHit":
        """The golden ``name`` for ``device`` (a key or torch device), following the fallback chain."""
        __tracebackhide__ = True
        return self.session.lookup(name, device_key(device), nodeid=self.nodeid)

    def check(self, name: str, tensors: Mapping[str, "torch.Tensor"], *, device: Any = None,
              compare: Callable[[Mapping[str, Any], "GoldenHit"], Any] | None = None,
              metadata: Mapping[str, Any] | None = None) -> "GoldenResult":
        """Compare ``tensors`` with golden ``name``; raises ``GateFailure`` on a mismatch or missing golden.

        ``compare(candidate, hit)`` replaces the default :class:`TensorComparator`; under
        ``--ditgate-freeze`` a missing golden is queued for writing instead (``--ditgate-refreeze``: always).
        """
        __tracebackhide__ = True
        key = device_key(device, tensors)
        return self.session.check(name, tensors, key, compare=compare, nodeid=self.nodeid, metadata=metadata)
