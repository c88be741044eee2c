"""What a candidate's sampling executed, recorded around its transformer (fixed code of the DiT gate suite).

The candidate samples with its own loop (``dit_impl/fast/sampler.py``, a mutable path), so what it claims about
its sampling is not evidence. :func:`traced` hands it a model whose transformer records every call (batch,
timestep) and, where the blocks run eagerly, how many blocks ran in each call and whether float32 matmuls were
allowed TF32 while they ran. :func:`executed` turns that into the settings ``ditgate_candidate.declare``
compares with the frozen case's (:func:`frozen`): another step count, other timesteps, fewer guided calls or
fewer blocks per call make the run ``approximate``, whatever was claimed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any


@dataclass
class SamplingTrace:
    """One sampling run's transformer calls: (batch, first timestep value, blocks run) each."""

    calls: list[tuple[int, float, int]] = field(default_factory=list)
    #: a block ran while float32 matmuls or convolutions could use TF32
    tf32: bool = False
    #: the blocks' hooks run (an eager model): blocks per call is known
    eager: bool = True


class TracedTransformer:
    """The candidate's transformer, called through: records each call before running it."""

    def __init__(self, inner: Any, trace: SamplingTrace) -> None:
        self._inner, self._trace = inner, trace
        self._blocks = 0

    def __getattr__(self, name: str) -> Any:  # dtype, device, transformer_blocks, use_block_cache, ...
        return getattr(self._inner, name)

    def _block_ran(self, *_args: Any) -> None:
        import torch

        self._blocks += 1
        if torch.get_float32_matmul_precision() != "highest" or torch.backends.cudnn.allow_tf32:
            self._trace.tf32 = True

    def __call__(self, hidden_states: Any, timestep: Any = None, class_labels: Any = None, **kwargs: Any) -> Any:
        import torch

        self._blocks = 0
        out = self._inner(hidden_states, timestep=timestep, class_labels=class_labels, **kwargs)
        first = torch.as_tensor(timestep).reshape(-1)[0] if timestep is not None else float("nan")
        self._trace.calls.append((int(hidden_states.shape[0]), float(first), self._blocks))
        return out


def traced(model: Any, module: Any) -> tuple[Any, SamplingTrace, Any]:
    """(a copy of the ``DitModel`` ``model`` whose transformer records its calls, the trace, a function that
    removes the block hooks). ``module`` is the ``nn.Module`` behind the transformer: its blocks' hooks count
    the blocks of each call (a CUDA graph replay runs none: then the count is unknown, never zero)."""
    trace = SamplingTrace(eager=module is model.transformer)
    wrapper = TracedTransformer(model.transformer, trace)
    handles = [block.register_forward_pre_hook(lambda *a: wrapper._block_ran()) for block in module.transformer_blocks]

    def remove() -> None:
        for handle in handles:
            handle.remove()

    return replace(model, transformer=wrapper), trace, remove


def executed(trace: SamplingTrace, batch: int) -> dict[str, Any]:
    """The settings a run executed, as the frozen case states them (``batch``: the case's images)."""
    out: dict[str, Any] = {"num_steps": len(trace.calls), "timesteps": [round(t, 3) for _, t, _ in trace.calls],
                           "guided_calls": sum(1 for b, _, _ in trace.calls if b > batch)}
    counts = [blocks for _, _, blocks in trace.calls]
    if trace.eager and counts and all(counts):  # hooks that saw no block at all are blind (compiled, replayed)
        out["blocks_per_call"] = min(counts)
    return out


def frozen(case: Any, layers: int) -> dict[str, Any]:
    """What the baseline's loop executes for ``case``: its steps and timesteps, a guided call per step (with
    guidance), every block in every call."""
    from dit_impl.baseline.sampling import make_scheduler

    scheduler = make_scheduler(case.scheduler)
    scheduler.set_timesteps(case.steps)
    return {"num_steps": case.steps, "timesteps": [round(float(t), 3) for t in scheduler.timesteps],
            "guided_calls": case.steps if case.guidance_scale > 1 else 0, "blocks_per_call": layers}
