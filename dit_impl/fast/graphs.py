"""CUDA graphs for the fast DiT: one captured graph per shape bucket, replayed with static input buffers.

A bucket is (latent shape, latent dtype, timestep dtype, label dtype, device). The first call of a
bucket warms the model up on a side stream (this is also where compiled blocks compile), captures one
forward into a graph, and keeps its input and output buffers; later calls copy the inputs in, replay,
and return a clone of the output (a replay overwrites the buffer, a caller must never see that).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from dit_impl.fast.model import FastDiT


@dataclass
class _Bucket:
    graph: Any
    x: "torch.Tensor"
    t: "torch.Tensor"
    y: "torch.Tensor"
    out: "torch.Tensor"
    capture_seconds: float


@dataclass
class GraphedDiT:
    """Callable like the model (``(x, timestep=, class_labels=).sample``), replaying per-bucket CUDA graphs."""

    model: "FastDiT"
    warmup: int = 2
    buckets: dict[tuple, _Bucket] = field(default_factory=dict)
    pool: Any = None

    def __post_init__(self) -> None:
        if self.model.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a model on CUDA, this one is on {self.model.device}")

    # attributes the samplers read from a transformer
    @property
    def dtype(self) -> "torch.dtype":
        return self.model.dtype

    @property
    def device(self) -> "torch.device":
        return self.model.device

    @property
    def transformer_blocks(self) -> Any:
        return self.model.transformer_blocks

    def _capture(self, x: "torch.Tensor", t: "torch.Tensor", y: "torch.Tensor") -> _Bucket:
        import torch

        from pytest_ditgate.bench.graphs import generator_kept

        start = time.perf_counter()
        sx, st, sy = x.clone(), t.clone(), y.clone()
        stream = torch.cuda.Stream(device=x.device)
        stream.wait_stream(torch.cuda.current_stream(x.device))
        with torch.cuda.stream(stream), torch.inference_mode():
            for _ in range(self.warmup):
                self.model(sx, timestep=st, class_labels=sy)
        torch.cuda.current_stream(x.device).wait_stream(stream)
        torch.cuda.synchronize(x.device)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        try:
            with generator_kept(), torch.inference_mode(), torch.cuda.graph(graph, pool=self.pool):
                out = self.model(sx, timestep=st, class_labels=sy).sample
        except Exception as exc:  # the model waited for the host, or ran out of memory: say which bucket
            raise RuntimeError(f"CUDA graph capture of the fast DiT failed for input {tuple(x.shape)} {x.dtype}: "
                               f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}; the "
                               "device's random generator is restored (cuda_graphs=False runs it eagerly)") from exc
        torch.cuda.synchronize(x.device)
        return _Bucket(graph, sx, st, sy, out, time.perf_counter() - start)

    def __call__(self, hidden_states: "torch.Tensor", timestep: Any = None, class_labels: Any = None,
                 return_dict: bool = True, **_ignored: Any) -> Any:
        import torch

        from dit_impl.fast.model import FastOutput

        if timestep is None or class_labels is None:
            raise ValueError("GraphedDiT needs both timestep and class_labels")
        batch = hidden_states.shape[0]
        t = torch.as_tensor(timestep, device=hidden_states.device).reshape(-1).expand(batch)
        y = torch.as_tensor(class_labels, device=hidden_states.device).reshape(-1)
        key = (tuple(hidden_states.shape), hidden_states.dtype, t.dtype, y.dtype, hidden_states.device)
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = self.buckets[key] = self._capture(hidden_states, t.contiguous(), y)
        else:
            bucket.x.copy_(hidden_states)
            bucket.t.copy_(t)
            bucket.y.copy_(y)
        bucket.graph.replay()
        out = bucket.out.clone()
        return FastOutput(sample=out) if return_dict else (out,)

    def replay(self) -> None:
        """Replay every captured graph once with its current buffers (for timing the bare graph)."""
        for bucket in self.buckets.values():
            bucket.graph.replay()

    def report(self) -> dict[str, Any]:
        return {**self.model.report(), "cuda_graphs": {
            "buckets": [f"{list(k[0])}:{str(k[1]).replace('torch.', '')}" for k in self.buckets],
            "capture_seconds": [round(b.capture_seconds, 3) for b in self.buckets.values()]}}
