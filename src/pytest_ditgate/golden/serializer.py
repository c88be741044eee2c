"""Tensors <-> bytes for golden files: safetensors (never pickle). Torch is imported on use.

A different on-disk format is a subclass that changes ``file_extension``, ``serialize`` and
``deserialize``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from pytest_ditgate.dtypes import torch_name

if TYPE_CHECKING:
    import torch


class SafetensorsSerializer:
    """Dict of named tensors in one ``.safetensors`` file (tensors are copied to the CPU, contiguous)."""

    file_extension = ".safetensors"

    def serialize(self, tensors: Mapping[str, "torch.Tensor"], *, metadata: Mapping[str, str] | None = None) -> bytes:
        from safetensors.torch import save

        return save(plain_copies(tensors), metadata=dict(metadata or {}))

    def deserialize(self, data: bytes) -> dict[str, "torch.Tensor"]:
        from safetensors.torch import load

        return load(data)

    def describe(self, tensors: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """Shape and dtype per tensor, as the manifest stores them."""
        return {name: {"shape": list(t.shape), "dtype": torch_name(t.dtype)}
                for name, t in sorted(tensors.items())}


def plain_copies(tensors: Mapping[str, "torch.Tensor"]) -> dict[str, "torch.Tensor"]:
    """Each tensor detached, on the CPU, contiguous, and owning its storage: safetensors refuses tensors that
    share memory (``{"a": x, "b": x}``, views of one buffer), which are still values a golden can hold."""
    plain = {}
    seen: set[tuple[int, int]] = set()
    for name, tensor in tensors.items():
        t = tensor.detach().to("cpu").contiguous()
        storage = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        if storage in seen or t.untyped_storage().nbytes() != t.numel() * t.element_size():
            t = t.clone()
            storage = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        seen.add(storage)
        plain[name] = t
    return plain
