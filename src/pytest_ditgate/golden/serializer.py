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

        return save({name: t.detach().to("cpu").contiguous() for name, t in tensors.items()},
                    metadata=dict(metadata or {}))

    def deserialize(self, data: bytes) -> dict[str, "torch.Tensor"]:
        from safetensors.torch import load

        return load(data)

    def describe(self, tensors: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """Shape and dtype per tensor, as the manifest stores them."""
        return {name: {"shape": list(t.shape), "dtype": torch_name(t.dtype)}
                for name, t in sorted(tensors.items())}
