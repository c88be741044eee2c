"""Attention logits of a diffusers DiT: their peak, and a training penalty that keeps them under a cap.

Diffusers' DiT has no QK norm. adaLN's scale multiplies each attention input, so nothing bounds the
logits ``q k^T / sqrt(d)``. Trained without a cap on the H200, the shapes DiT's largest logit grew from 16 to
397 over 4000 steps, then jumped to 45 million as the loss spiked, three times over, and the run never got back
to its best loss; weights trained without this cap reach 27 760 in block 1 at t = 0, where bf16 rounding
makes each softmax row another distribution. :class:`LogitCap` adds
``weight * mean(relu(row max - cap)^2) / cap^2`` per block to the loss; it changes no module, so the baseline
and fast pipelines run the weights as they are. With it the same run's peak stayed under 100, with no spike
in 8 600 steps. The training loop watches the peak with :func:`attention_peak` with or without the penalty.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: the cap on a query's largest logit, and the penalty's weight: e^50 is one-hot already, and bf16 moves a
#: logit of 50 by about 0.2. It is for training from the start: forced onto weights whose logits had already
#: run away, it brought a peak of 5 107 to 81 in 150 steps and their samples' class accuracy fell to 0.36.
DEFAULT_CAP, DEFAULT_WEIGHT = 50.0, 0.01


def attention_logits(attention: Any, hidden: "torch.Tensor", round_to: "torch.dtype | None" = None
                     ) -> "torch.Tensor":
    """Pre-softmax logits ``q k^T / sqrt(d)``, ``(batch, heads, tokens, tokens)``, of a self-attention's input;
    with ``round_to``, from q and k rounded to that dtype first (what autocast multiplies), in float32."""
    batch, tokens, _ = hidden.shape

    def heads(x: "torch.Tensor") -> "torch.Tensor":
        x = x.view(batch, tokens, attention.heads, -1).transpose(1, 2)
        return x if round_to is None else x.to(round_to).float()

    q, k = heads(attention.to_q(hidden)), heads(attention.to_k(hidden))
    return q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])


def row_maxima(attention: Any, hidden: "torch.Tensor") -> "torch.Tensor":
    """Each query's largest pre-softmax logit, ``(batch, heads, tokens)``, for a self-attention's input, in
    float32 with autocast off: the logits themselves, not their bf16 rounding. (Read in bf16 inside a
    compiled bf16 training step, the penalty's gradients came out non-finite on the CPU's inductor.)"""
    import torch

    with torch.autocast(device_type=hidden.device.type, enabled=False):
        return attention_logits(attention, hidden.float()).amax(dim=-1)


class LogitCap:
    """Hooks on every block's self-attention that keep the row maxima of the last forward(s).

    ``images`` reads only the first that many images of each forward (a training batch's timesteps are
    random, so a slice of it sees every noise level at a fraction of the cost). ``penalty()`` turns them into
    the loss term and forgets them; ``peak()`` is the largest logit seen since
    the last ``penalty()`` or ``clear()``. Register before ``torch.compile``: the hooks are traced with the
    blocks. ``remove()`` takes the hooks off (the model is then the plain diffusers model again).
    """

    def __init__(self, transformer: "torch.nn.Module", cap: float = DEFAULT_CAP,
                 weight: float = DEFAULT_WEIGHT, *, images: int | None = None) -> None:
        if not (cap > 0 and weight >= 0 and math.isfinite(cap) and math.isfinite(weight)):
            raise ValueError(f"the logit cap must be > 0 and its weight >= 0, got cap={cap}, weight={weight}")
        if images is not None and images < 1:
            raise ValueError(f"the logit cap reads at least one image per forward, got images={images}")
        self.cap, self.weight, self.images = float(cap), float(weight), images
        self._maxima: list[torch.Tensor] = []
        self._handles = [block.attn1.register_forward_hook(self._keep, with_kwargs=True)
                         for block in transformer.transformer_blocks]

    def _keep(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], _output: Any) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]
        self._maxima.append(row_maxima(module, hidden if self.images is None else hidden[:self.images]))

    def penalty(self) -> "torch.Tensor":
        """The loss term for the forwards since the last call (zero when every row is under the cap)."""
        import torch
        import torch.nn.functional as F

        if not self._maxima:
            raise RuntimeError("LogitCap.penalty(): no forward ran through the hooked blocks since the last call")
        terms = [(F.relu(m.float() - self.cap) ** 2).mean() for m in self._maxima]
        self._maxima = []
        return self.weight * torch.stack(terms).sum() / self.cap ** 2

    def peak(self) -> float:
        """The largest logit kept since the last ``penalty()`` or ``clear()`` (``-inf`` if none)."""
        return max((float(m.detach().max()) for m in self._maxima), default=-math.inf)

    def clear(self) -> None:
        self._maxima = []

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles, self._maxima = [], []


def eval_prediction(transformer: "torch.nn.Module", xt: "torch.Tensor", t: "torch.Tensor", labels: "torch.Tensor"
                    ) -> "torch.Tensor":
    """The prediction on one batch in eval mode, float32 (autocast off), without gradient; the mode is restored."""
    import torch

    was_training = transformer.training
    try:
        transformer.eval()
        with torch.no_grad(), torch.autocast(device_type=xt.device.type, enabled=False):
            return transformer(xt.float(), timestep=t, class_labels=labels).sample
    finally:
        transformer.train(was_training)


def attention_peak(transformer: "torch.nn.Module", xt: "torch.Tensor", t: "torch.Tensor", labels: "torch.Tensor"
                   ) -> tuple[float, "torch.Tensor"]:
    """The largest attention logit of any block on one batch, and the ``eval_prediction`` it was read on."""
    probe = LogitCap(transformer)
    try:
        prediction = eval_prediction(transformer, xt, t, labels)
        return probe.peak(), prediction
    finally:
        probe.remove()
