"""The fast DiT transformer: the function of diffusers' ``DiTTransformer2DModel``, laid out for speed.

Same weights (see ``weights.py``), same arithmetic order, different layout: the conditioning of every
block (timestep MLP, label table, adaLN linear) is stacked and computed up front in batched matmuls,
Q/K/V can be one projection, attention runs on a chosen SDPA backend, the adaLN pieces can be the fused
kernels, blocks can be compiled one by one. ``FastDiT.report()`` says what each switch actually did.

Two switches change the arithmetic on purpose (other experiment classes): ``tf32`` runs the forward's float32
matmuls in TF32 (``numerical``), ``quant`` stores the blocks' linears in low bit (``quantization``,
``quant.py``). A sampler may reuse some blocks' output from an earlier step (:class:`BlockCache`,
``approximate``). Latents of any dtype are accepted and computed in the model's dtype.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dit_impl.fast import adaln, gemms, quant
from dit_impl.fast.attention import AttentionRecorder, sdpa
from dit_impl.fast.embeddings import TIMESTEP_CHANNELS, patch_positions, timestep_features
from dit_impl.fast.options import FastOptions
from dit_impl.shapes.variants import tf32

#: LayerNorm epsilons of diffusers' DiT: norm1 / norm_out use 1e-6, the pre-MLP norm3 uses norm_eps 1e-5
EPS_ATTN, EPS_MLP, EPS_OUT = 1e-6, 1e-5, 1e-6


@dataclass(frozen=True)
class DitShape:
    """The architecture numbers of a DiT (diffusers config keys of the same names)."""

    num_attention_heads: int
    attention_head_dim: int
    in_channels: int
    out_channels: int
    num_layers: int
    sample_size: int
    patch_size: int
    num_embeds_ada_norm: int = 1000

    @property
    def hidden(self) -> int:
        return self.num_attention_heads * self.attention_head_dim

    @property
    def grid(self) -> int:
        return self.sample_size // self.patch_size

    @classmethod
    def from_config(cls, config: Any) -> "DitShape":
        """From a diffusers config (mapping or FrozenDict); ``out_channels`` None means ``in_channels``."""
        get = config.get if hasattr(config, "get") else lambda k, d=None: getattr(config, k, d)
        norm_type = get("norm_type", "ada_norm_zero")
        if norm_type != "ada_norm_zero":
            raise ValueError(f"only norm_type='ada_norm_zero' DiTs are supported, got {norm_type!r}")
        if get("activation_fn", "gelu-approximate") != "gelu-approximate":
            raise ValueError(f"only activation_fn='gelu-approximate' is supported, got {get('activation_fn')!r}")
        if get("norm_elementwise_affine", False):
            raise ValueError("norm_elementwise_affine=True is not supported (DiT norms have no affine)")
        if not get("attention_bias", True):
            raise ValueError("attention_bias=False is not supported (DiT projections have biases)")
        in_channels = int(get("in_channels", 4))
        out = get("out_channels", None)
        return cls(num_attention_heads=int(get("num_attention_heads")),
                   attention_head_dim=int(get("attention_head_dim")), in_channels=in_channels,
                   out_channels=int(out) if out is not None else in_channels, num_layers=int(get("num_layers")),
                   sample_size=int(get("sample_size")), patch_size=int(get("patch_size")),
                   num_embeds_ada_norm=int(get("num_embeds_ada_norm", 1000)))


@dataclass
class BlockCache:
    """Reuse of blocks ``first`` .. ``last - 1`` across sampler steps (set by a sampler with
    ``FastDiT.use_block_cache``): a call with ``reuse`` false runs them and keeps what they added to the
    residual stream; a call with ``reuse`` true skips them and adds that again. A batch of another shape (a
    guidance cutoff halves it) runs them and keeps the new difference."""

    first: int
    last: int
    reuse: bool = False
    delta: Any = None

    def ready(self, x: torch.Tensor) -> bool:
        return self.reuse and self.delta is not None and self.delta.shape == x.shape


@dataclass
class FastOutput:
    """Mirrors diffusers' ``Transformer2DModelOutput`` (``.sample``) so samplers take either model."""

    sample: torch.Tensor


class Conditioning(nn.Module):
    """Timestep + label embedding and adaLN modulation of all blocks, stacked along a leading axis.

    ``E`` embedders (``L``, or 1 when every block holds identical embedder weights, as converted DiT
    checkpoints do) and ``L`` adaLN linears. ``forward`` returns (embeddings [E, B, D], modulation
    [L, B, 6D]); the final layer uses embedder 0, as diffusers does.
    """

    def __init__(self, shape: DitShape, embedders: int, batched: bool) -> None:
        super().__init__()
        d, layers = shape.hidden, shape.num_layers
        self.batched = batched
        self.t_w1 = nn.Parameter(torch.empty(embedders, d, TIMESTEP_CHANNELS))
        self.t_b1 = nn.Parameter(torch.empty(embedders, d))
        self.t_w2 = nn.Parameter(torch.empty(embedders, d, d))
        self.t_b2 = nn.Parameter(torch.empty(embedders, d))
        self.labels = nn.Parameter(torch.empty(embedders, shape.num_embeds_ada_norm + 1, d))
        self.ada_w = nn.Parameter(torch.empty(layers, 6 * d, d))
        self.ada_b = nn.Parameter(torch.empty(layers, 6 * d))

    @property
    def embedders(self) -> int:
        return self.t_w1.shape[0]

    def forward(self, timestep: torch.Tensor, class_labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dtype, layers = self.ada_w.dtype, self.ada_w.shape[0]
        feats = timestep_features(timestep).to(dtype)
        if self.batched:
            e = self.embedders
            h = torch.baddbmm(self.t_b1[:, None], feats.expand(e, *feats.shape), self.t_w1.transpose(1, 2))
            h = torch.baddbmm(self.t_b2[:, None], F.silu(h), self.t_w2.transpose(1, 2))
            emb = h + self.labels[:, class_labels]
            act = F.silu(emb).expand(layers, -1, -1) if e == 1 else F.silu(emb)
            mod = torch.baddbmm(self.ada_b[:, None], act, self.ada_w.transpose(1, 2))
            return emb, mod
        embs = []
        for i in range(self.embedders):
            h = F.linear(F.silu(F.linear(feats, self.t_w1[i], self.t_b1[i])), self.t_w2[i], self.t_b2[i])
            embs.append(h + F.embedding(class_labels, self.labels[i]))
        emb = torch.stack(embs)
        mods = [F.linear(F.silu(emb[i if len(embs) > 1 else 0]), self.ada_w[i], self.ada_b[i]) for i in range(layers)]
        return emb, torch.stack(mods)


class FastBlock(nn.Module):
    """One adaLN-Zero DiT block taking its precomputed modulation [B, 6D] instead of computing it."""

    def __init__(self, shape: DitShape, options: FastOptions) -> None:
        super().__init__()
        d = shape.hidden
        self.heads, self.head_dim = shape.num_attention_heads, shape.attention_head_dim
        self.fused_qkv, self.gelu_epilogue, self.backend = options.fused_qkv, options.gelu_epilogue, options.sdpa
        if self.fused_qkv:
            self.qkv = nn.Linear(d, 3 * d)
        else:
            self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.out = nn.Linear(d, d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        self.ops = adaln.torch_ops("default")
        self.gemms = gemms.cublas("default")

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        if self.fused_qkv:
            qkv = self.qkv(x) if self.gemms.qkv is None else self.gemms.qkv(x, self.qkv)
            q, k, v = qkv.view(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        else:
            q, k, v = (proj(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
                       for proj in (self.q, self.k, self.v))
        out = sdpa(q, k, v, self.backend)
        return self.out(out.transpose(1, 2).reshape(b, n, d))

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        if self.gemms.fc1_gelu is not None:
            return self.fc2(self.gemms.fc1_gelu(x, self.fc1))
        if self.gelu_epilogue:
            flat = x.reshape(-1, x.shape[-1])
            h = torch._addmm_activation(self.fc1.bias, flat, self.fc1.weight.t(), use_gelu=True)
            return self.fc2(h).view(*x.shape[:-1], -1)
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))

    def forward(self, x: torch.Tensor, mod: torch.Tensor, h: torch.Tensor | None = None,
                closing: tuple[torch.Tensor, torch.Tensor, float] | None = None) -> Any:
        """The block: ``x`` -> ``x``. Seamed (``block_seam``): ``h`` is this block's normalised input, made by
        the previous block, and ``closing`` the (shift, scale, eps) of the LayerNorm after it; returns
        ``(x, that LayerNorm's modulated output)``, so a recording hook still finds ``x`` first."""
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = mod.chunk(6, dim=1)
        if h is None:
            h = self.ops.norm_modulate(x, shift_msa, scale_msa, EPS_ATTN)
        x, h = self.ops.residual_norm_modulate(x, gate_msa, self.attention(h), shift_mlp, scale_mlp, EPS_MLP)
        if closing is None:
            return self.ops.gated_residual(x, gate_mlp, self.mlp(h))
        shift, scale, eps = closing
        return self.ops.residual_norm_modulate(x, gate_mlp, self.mlp(h), shift, scale, eps)


class FastDiT(nn.Module):
    """DiT transformer with diffusers' call signature: ``model(x, timestep=t, class_labels=y).sample``.

    Build it with ``weights.from_diffusers`` / ``weights.load_diffusers_state_dict`` /
    ``weights.from_pretrained``; ``prepare()`` applies the device-dependent switches (kernels, compile).
    """

    def __init__(self, shape: DitShape, options: FastOptions | None = None, *, embedders: int | None = None) -> None:
        super().__init__()
        self.shape, self.options = shape, options or FastOptions()
        d, p = shape.hidden, shape.patch_size
        self.recorder = AttentionRecorder(self.options.sdpa, strict=self.options.strict)
        self.patch = nn.Conv2d(shape.in_channels, d, kernel_size=p, stride=p)
        self.register_buffer("pos_embed", patch_positions(d, shape.grid), persistent=False)
        self.cond = Conditioning(shape, embedders or shape.num_layers, self.options.batched_conditioning)
        self.transformer_blocks = nn.ModuleList(FastBlock(shape, self.options) for _ in range(shape.num_layers))
        self.proj_out_1 = nn.Linear(d, 2 * d)
        self.proj_out_2 = nn.Linear(d, p * p * shape.out_channels)
        self.adaln_impl = adaln.torch_ops("not prepared")
        self.gelu_epilogue_reason = "not prepared"
        self.gemms = gemms.cublas("not prepared")
        self.quant_report = "off"
        self.block_cache: BlockCache | None = None
        self._compiled = False
        self._quantized = False

    @property
    def dtype(self) -> torch.dtype:
        return self.proj_out_2.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.proj_out_2.weight.device

    def _fell_back(self, message: str, warn: bool = True) -> None:
        """A chosen fast path is not running: raise under ``strict``, else warn (``warn=False``: an ``auto``
        choice, whose fall-back is expected and silent)."""
        if self.options.strict:
            raise RuntimeError(message)
        if warn:
            warnings.warn(message, RuntimeWarning, stacklevel=3)

    def prepare(self) -> "FastDiT":
        """Apply the switches that depend on where the model lives: adaLN implementation and compile."""
        compiled = self.options.compile == "blocks"
        quantized = self.options.quant != "none"
        if quantized and not self._quantized:  # before compile: the blocks trace their quantized linears
            self.quant_report = quant.quantize_blocks(self, self.options.quant, emulate=self.options.fp8_emulate)
            self._quantized = True
        self.adaln_impl = adaln.resolve_ops(self.options.adaln, self.device.type, compiled)
        if self.options.adaln != "torch" and self.adaln_impl.impl == "torch":
            self._fell_back(f"adaln={self.options.adaln!r} fell back to PyTorch ops: {self.adaln_impl.reason}",
                            warn=self.options.adaln == "kernels")
        self.gemms = (gemms.cublas(f"quant={self.options.quant}: the blocks' GEMMs are its quantized linears")
                      if quantized else gemms.resolve_gemms(self.options.gemm, self.device, self.dtype, compiled,
                                                            self.options.fused_qkv))
        if self.options.gemm != "cublas" and self.gemms.impl == "cublas":
            self._fell_back(f"gemm={self.options.gemm!r} fell back to cuBLAS: {self.gemms.reason}")
        # CPU's _addmm_activation applies the erf GELU, not tanh: the epilogue is only exact on CUDA (cuBLASLt)
        epilogue = self.options.gelu_epilogue and self.device.type == "cuda" and not quantized
        self.gelu_epilogue_reason = ("off" if not self.options.gelu_epilogue else
                                     f"ignored: quant={self.options.quant} runs fc1 as a quantized linear"
                                     if quantized else
                                     f"superseded: gemm={self.options.gemm} runs fc1 with its own GELU epilogue"
                                     if self.gemms.fc1_gelu is not None else
                                     "cuBLASLt GELU(tanh) epilogue" if epilogue else
                                     f"ignored on {self.device.type}: its _addmm_activation uses the erf GELU")
        for block in self.transformer_blocks:
            block.ops = self.adaln_impl
            block.gemms = self.gemms
            block.gelu_epilogue = epilogue
            if compiled and not self._compiled:
                block.compile(mode=self.options.compile_mode, dynamic=False, fullgraph=False)
        self._compiled = compiled
        return self

    def _probe_attention(self, batch: int, tokens: int) -> None:
        s = self.shape
        if not self.recorder.needs((batch, s.num_attention_heads, tokens, s.attention_head_dim), self.dtype,
                                   self.device):
            return
        qkv = torch.randn(batch, tokens, 3, s.num_attention_heads, s.attention_head_dim,
                          dtype=self.dtype, device=self.device)
        self.recorder.probe(*qkv.permute(2, 0, 3, 1, 4))

    def use_block_cache(self, cache: BlockCache | None) -> None:
        """Let the following calls reuse blocks as ``cache`` says (None: every block runs, the default)."""
        if cache is not None:
            if self.options.block_seam:
                raise ValueError("a block cache needs block_seam=False (a seamed block hands its successor a "
                                 "normalised input, which a skipped block would not)")
            if not 0 <= cache.first < cache.last <= len(self.transformer_blocks):
                raise ValueError(f"block cache {cache.first}..{cache.last} is outside the model's "
                                 f"{len(self.transformer_blocks)} blocks")
        self.block_cache = cache

    def forward(self, hidden_states: torch.Tensor, timestep: torch.Tensor | float | int | None = None,
                class_labels: torch.Tensor | None = None, return_dict: bool = True, **_ignored: Any) -> Any:
        if timestep is None or class_labels is None:
            raise ValueError("FastDiT needs both timestep and class_labels (a class-conditional DiT)")
        with tf32(True) if self.options.tf32 else contextlib.nullcontext():  # around the forward only
            return self._forward(hidden_states.to(self.dtype), timestep, class_labels, return_dict)

    def _forward(self, hidden_states: torch.Tensor, timestep: Any, class_labels: torch.Tensor,
                 return_dict: bool) -> Any:
        batch = hidden_states.shape[0]
        timestep = torch.as_tensor(timestep, device=hidden_states.device).reshape(-1).expand(batch)
        p, grid = self.shape.patch_size, hidden_states.shape[-1] // self.shape.patch_size
        x = self.patch(hidden_states).flatten(2).transpose(1, 2)
        # token-major contiguous residual stream (the conv leaves it channel-major): fused kernels need it
        x = (x + self.pos_embed).to(x.dtype).contiguous()
        if not torch.compiler.is_compiling():
            self._probe_attention(batch, x.shape[1])
        emb, mod = self.cond(timestep, class_labels)
        shift, scale = self.proj_out_1(F.silu(emb[0])).chunk(2, dim=1)
        if self.options.block_seam:
            x = self._seamed_blocks(x, mod, shift, scale)
        else:
            x = self._blocks(x, mod)
            x = F.layer_norm(x, x.shape[-1:], eps=EPS_OUT) * (1 + scale[:, None]) + shift[:, None]
        x = self.proj_out_2(x)
        c = self.shape.out_channels
        x = x.reshape(batch, grid, grid, p, p, c).permute(0, 5, 1, 3, 2, 4)
        out = x.reshape(batch, c, grid * p, grid * p)
        return FastOutput(sample=out) if return_dict else (out,)

    def _blocks(self, x: torch.Tensor, mod: torch.Tensor) -> torch.Tensor:
        """Every block in turn; with a block cache, its blocks run or their kept difference is added."""
        cache, blocks = self.block_cache, self.transformer_blocks
        if cache is None:
            for i, block in enumerate(blocks):
                x = block(x, mod[i])
            return x
        for i in range(cache.first):
            x = blocks[i](x, mod[i])
        if cache.ready(x):
            x = x + cache.delta
        else:
            start = x
            for i in range(cache.first, cache.last):
                x = blocks[i](x, mod[i])
            cache.delta = x - start
        for i in range(cache.last, len(blocks)):
            x = blocks[i](x, mod[i])
        return x

    def _seamed_blocks(self, x: torch.Tensor, mod: torch.Tensor, shift_out: torch.Tensor,
                       scale_out: torch.Tensor) -> torch.Tensor:
        """The blocks with each one's closing residual fused into the next LayerNorm (``block_seam``); returns
        the output LayerNorm's modulated result, the input of ``proj_out_2``."""
        blocks = self.transformer_blocks
        shift_msa, scale_msa = mod[0].chunk(6, dim=1)[:2]
        h = self.adaln_impl.norm_modulate(x, shift_msa, scale_msa, EPS_ATTN)
        for i, block in enumerate(blocks):
            if i + 1 < len(blocks):
                closing = (*mod[i + 1].chunk(6, dim=1)[:2], EPS_ATTN)
            else:
                closing = (shift_out, scale_out, EPS_OUT)
            x, h = block(x, mod[i], h=h, closing=closing)
        return h

    def report(self) -> dict[str, Any]:
        """What ran: options, SDPA backend per shape, adaLN implementation, compile, embedder sharing."""
        return {"options": self.options.to_dict(), "label": self.options.label(), "sdpa": self.recorder.report(),
                "adaln": {"impl": self.adaln_impl.impl, "reason": self.adaln_impl.reason},
                "gelu_epilogue": self.gelu_epilogue_reason,
                "gemm": {"impl": self.gemms.impl, "reason": self.gemms.reason}, "quant": self.quant_report,
                "tf32": self.options.tf32,
                "compile": {"mode": self.options.compile, "compile_mode": self.options.compile_mode},
                "shared_embedder": self.cond.embedders == 1, "dtype": str(self.dtype).replace("torch.", ""),
                "device": str(self.device)}
