"""``kernel_check`` of every block the fast DiT replaces, against the diffusers block holding the same weights.

The candidate is the fast implementation's own module or method; the reference is the diffusers module
it replaces (``Attention``, ``BasicTransformerBlock`` with ``ada_norm_zero``, ``PatchEmbed``, the
``CombinedTimestepLabelEmbeddings`` + adaLN linear of each block, the final layer), deep-copied per input
dtype so that ``check_kernel`` can run it in float64 on its upcast inputs. Fresh random inputs per
trial. Pieces that the fast model only exposes inside its forward (patch embedding, final layer) are
reached through forward hooks on its blocks, so the code under test is the code that samples.

Bounds: a fast block passes when it is within the dtype's ``check_kernel`` tolerance of the float64
reference, or, where diffusers' own block in that dtype is less accurate than the table, within twice
diffusers' error (a bf16 DiT block rounds more than one bf16 op does). On the CPU: ``tiny`` in float32;
on a GPU with bf16: DiT-XL/2 widths (hidden 1152, 16x72 heads, 256 tokens, 2 blocks) in bf16.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import pytest

from dit_gate_support import drop_shift
from dit_impl.fast.options import FastOptions

XL = pytest.mark.requires_gpu(bf16=True, min_memory_gb=20, why="DiT-XL/2 block shapes in bf16")
TRIALS = 3


@dataclass
class Lane:
    """One diffusers DiT (float32 weights) on a device, the dtype its blocks are checked in, and inputs."""

    name: str
    device: str
    dtype: str
    batch: int
    reference: Any = None
    _copies: dict = field(default_factory=dict)

    @property
    def torch_dtype(self) -> Any:
        import torch

        return getattr(torch, self.dtype)

    def build(self) -> "Lane":
        from diffusers import DiTTransformer2DModel

        from dit_impl.baseline.configs import get_config
        from dit_impl.baseline.weights import init_random_

        kwargs = dict(get_config("tiny" if self.name == "tiny" else "dit-xl-2-256").transformer)
        if self.name == "xl":
            kwargs["num_layers"] = 2  # XL/2 widths, two blocks: every replaced piece, seconds not minutes
        import torch

        with torch.device(self.device):
            model = DiTTransformer2DModel(**kwargs)
        init_random_(model, 3)
        self.reference = model.eval().requires_grad_(False)
        return self

    @property
    def config(self) -> Any:
        return self.reference.config

    def fast(self, text: str = "default") -> Any:
        """A ``FastDiT`` with the reference's weights and the switches ``text`` in this lane's dtype."""
        from dit_impl.fast.weights import from_diffusers

        return from_diffusers(self.reference, FastOptions.parse(text, FastOptions(dtype=self.dtype)))

    def reference_in(self, dtype: Any) -> Any:
        """The diffusers model cast to ``dtype`` (a deep copy, made once): float64 for the reference side."""
        if dtype not in self._copies:
            self._copies[dtype] = copy.deepcopy(self.reference).to(dtype)
        return self._copies[dtype]

    # -- inputs (a fresh draw per seed) -----------------------------------------------------------
    def _gen(self, seed: int) -> Any:
        import torch

        return torch.Generator("cpu").manual_seed(seed)

    def tokens(self, seed: int) -> Any:
        import torch

        c = self.config
        n = (c.sample_size // c.patch_size) ** 2
        d = c.num_attention_heads * c.attention_head_dim
        return torch.randn(self.batch, n, d, generator=self._gen(seed)).to(self.device, self.torch_dtype)

    def conditioning(self, seed: int) -> tuple[Any, Any]:
        """Float timesteps in the lane's dtype (they carry the dtype to the reference); labels with the null class."""
        import torch

        g = self._gen(10_000 + seed)
        t = (torch.rand(self.batch, generator=g) * 999).to(self.device, self.torch_dtype)
        y = torch.randint(0, 1000, (self.batch,), generator=g)
        y[-1] = 1000  # the CFG null class
        return t, y.to(self.device)

    def latents(self, seed: int) -> Any:
        import torch

        c = self.config
        x = torch.randn(self.batch, c.in_channels, c.sample_size, c.sample_size, generator=self._gen(20_000 + seed))
        return x.to(self.device, self.torch_dtype)


LANES = {"tiny": ("tiny", "cpu", "float32", 4), "xl": ("xl", "cuda", "bfloat16", 4)}


def _lane_id(name: str) -> str:
    return "-".join(LANES[name][:3])  # name-device-dtype


def lane_params(cpu: tuple[str, ...], gpu: tuple[str, ...], **gpu_marks: Any) -> list[Any]:
    """(lane, switches) parameters: ``cpu`` switches on the tiny CPU lane, ``gpu`` ones on the XL lane.

    ``gpu_marks`` maps a switch string to extra ``requires_gpu`` keyword arguments (SDPA backend, nvcc).
    """
    out = [pytest.param(("tiny", s), id=f"{_lane_id('tiny')}-{s}") for s in cpu]
    for s in gpu:
        marks = [XL] + ([pytest.mark.requires_gpu(**gpu_marks[s])] if s in gpu_marks else [])
        out.append(pytest.param(("xl", s), id=f"{_lane_id('xl')}-{s}", marks=marks))
    return out


@pytest.fixture(scope="module")
def lanes() -> Iterator[dict[str, Lane]]:
    """Lanes built on first use, one at a time (the XL reference and its float64 copy are large)."""
    pytest.importorskip("diffusers")
    built: dict[str, Lane] = {}
    yield built
    if "xl" in built:
        import torch

        built.clear()
        torch.cuda.empty_cache()


def get_lane(lanes: dict[str, Lane], name: str) -> Lane:
    if name not in lanes:
        lanes.clear()
        lanes[name] = Lane(*LANES[name]).build()
    return lanes[name]


def bounds_from_diffusers(reference: Callable[..., Any], make_inputs: Callable[[int], tuple],
                          lane: Lane) -> dict[str, float]:
    """``atol``/``rel_norm`` for ``check_kernel``: the dtype's table values, widened to twice the error of
    diffusers' own module in the lane's dtype against its float64 copy on the same trial inputs."""
    import torch

    from pytest_ditgate.correctness.tolerances import tolerance_for

    table = tolerance_for(lane.dtype)
    worst_abs, worst_rel = 0.0, 0.0
    with torch.inference_mode():
        for seed in range(TRIALS):
            args = make_inputs(seed)
            wide = tuple(a.double() if a.is_floating_point() else a for a in args)
            native, exact = _flat(reference(*args)), _flat(reference(*wide))
            for n, e in zip(native, exact):
                diff = n.double() - e
                worst_abs = max(worst_abs, float(diff.abs().max()))
                worst_rel = max(worst_rel, float(diff.norm() / e.norm()))
    return {"atol": max(table.atol, 2 * worst_abs), "rel_norm": max(table.rel_norm, 2 * worst_rel)}


def _flat(out: Any) -> list[Any]:
    return [t for item in out for t in _flat(item)] if isinstance(out, (tuple, list)) else [out]


def check(kernel_check: Any, lane: Lane, candidate: Callable[..., Any], reference: Callable[..., Any],
          make_inputs: Callable[[int], tuple], label: str) -> Any:
    import torch

    # the bounds are diffusers' own error at the lane's activation scale (bounds_from_diffusers): a whole
    # block with its weights is checked at the scales the model produces, not at the extremal trials' 1e-3
    # and 1e3, which are the single ops' gates' (tests/gates/kernels)
    with torch.inference_mode():
        return kernel_check(candidate, reference, make_inputs, trials=TRIALS, label=f"{label} [{lane.name}]",
                            input_scales=(), **bounds_from_diffusers(reference, make_inputs, lane))


@contextlib.contextmanager
def hooked(module: Any, hook: Callable[..., Any], *, pre: bool = False) -> Iterator[None]:
    handle = (module.register_forward_pre_hook(hook, with_kwargs=True) if pre else module.register_forward_hook(hook))
    try:
        yield
    finally:
        handle.remove()


# -- attention: fused QKV + SDPA on a chosen backend vs diffusers' Attention --------------------------

_SDPA = ("sdpa=flash", "sdpa=cudnn", "sdpa=efficient")
ATTENTION = lane_params(("default", "fused_qkv=0", "sdpa=math", "fused_qkv=0,sdpa=math"),
                        ("default", "fused_qkv=0", "sdpa=math", *_SDPA),
                        **{s: {"sdpa": s.split("=")[1], "why": f"{s} attention"} for s in _SDPA})


@pytest.mark.parametrize("case", ATTENTION)
def test_fast_attention_matches_diffusers_attention(case, lanes, kernel_check) -> None:
    lane, switches = get_lane(lanes, case[0]), case[1]
    block = lane.fast(switches).transformer_blocks[-1]

    def reference(x):
        return lane.reference_in(x.dtype).transformer_blocks[-1].attn1(x)

    report = check(kernel_check, lane, block.attention, reference, lambda seed: (lane.tokens(seed),),
                   f"attention[{switches}]")
    assert report.passed


# -- one adaLN-Zero block (its conditioning hoisted into Conditioning) vs BasicTransformerBlock --------

_KERNELS = {"nvcc": True, "why": "adaln=kernels JIT-builds the fused kernels"}
BLOCK = lane_params(("default", "fused_qkv=0,batched_conditioning=0"),
                    ("default", "fused_qkv=0,batched_conditioning=0", "gelu_epilogue=1", "adaln=kernels",
                     "adaln=kernels,gelu_epilogue=1,sdpa=cudnn"),
                    **{"adaln=kernels": _KERNELS,
                       "adaln=kernels,gelu_epilogue=1,sdpa=cudnn": {**_KERNELS, "sdpa": "cudnn"}})


@pytest.mark.parametrize("case", BLOCK)
def test_fast_block_matches_basic_transformer_block(case, lanes, kernel_check) -> None:
    lane, switches = get_lane(lanes, case[0]), case[1]
    fast = lane.fast(switches)
    if "adaln=kernels" in switches:
        assert fast.report()["adaln"]["impl"] == "kernels", fast.report()["adaln"]["reason"]
    if "gelu_epilogue=1" in switches:
        assert fast.report()["gelu_epilogue"].startswith("cuBLASLt"), fast.report()["gelu_epilogue"]
    last = len(fast.transformer_blocks) - 1
    assert lane.reference.transformer_blocks[last].norm_type == "ada_norm_zero"

    def candidate(x, t, y):
        _, mod = fast.cond(t, y)
        return fast.transformer_blocks[last](x, mod[last])

    def reference(x, t, y):
        block = lane.reference_in(x.dtype).transformer_blocks[last]
        return block(x, timestep=t, class_labels=y)

    def make_inputs(seed):
        return (lane.tokens(seed), *lane.conditioning(seed))

    assert check(kernel_check, lane, candidate, reference, make_inputs, f"block[{switches}]").passed


@pytest.mark.parametrize("case", lane_params(("block_seam=1",), ("block_seam=1", "adaln=kernels,block_seam=1"),
                                             **{"adaln=kernels,block_seam=1": _KERNELS}))
def test_seamed_block_matches_a_block_and_the_next_layernorm(case, lanes, kernel_check) -> None:
    """A seamed block (``block_seam``) gets its input normalised and ends in the next block's LayerNorm +
    modulation: (diffusers' block output, the next block's ``norm1`` of it)."""
    from dit_impl.fast.model import EPS_ATTN

    lane, switches = get_lane(lanes, case[0]), case[1]
    fast = lane.fast(switches)
    if "adaln=kernels" in switches:
        assert fast.report()["adaln"]["impl"] == "kernels", fast.report()["adaln"]["reason"]
    i = len(fast.transformer_blocks) - 2  # a block with a next one

    def candidate(x, t, y):
        _, mod = fast.cond(t, y)
        shift, scale = mod[i].chunk(6, dim=1)[:2]
        h = fast.adaln_impl.norm_modulate(x, shift, scale, EPS_ATTN)
        return fast.transformer_blocks[i](x, mod[i], h=h, closing=(*mod[i + 1].chunk(6, dim=1)[:2], EPS_ATTN))

    def reference(x, t, y):
        blocks = lane.reference_in(x.dtype).transformer_blocks
        out = blocks[i](x, timestep=t, class_labels=y)
        return out, blocks[i + 1].norm1(out, t, y, hidden_dtype=x.dtype)[0]

    def make_inputs(seed):
        return (lane.tokens(seed), *lane.conditioning(seed))

    assert check(kernel_check, lane, candidate, reference, make_inputs, f"seamed block[{switches}]").passed


# -- embeddings: patch embedding + positions, timestep/label embedding + adaLN modulation --------------

def _block_input(model: Any, latents: Any, t: Any, y: Any) -> Any:
    """What ``model`` hands its first block: the patch embedding plus the position table."""
    seen = []

    def grab(_module, args, kwargs):
        seen.append((args[0] if args else kwargs["hidden_states"]).clone())

    with hooked(model.transformer_blocks[0], grab, pre=True):
        model(latents, timestep=t, class_labels=y)
    return seen[0]


@pytest.mark.parametrize("case", lane_params(("default",), ("default",)))
def test_fast_patch_embedding_matches_diffusers(case, lanes, kernel_check) -> None:
    lane = get_lane(lanes, case[0])
    fast = lane.fast(case[1])

    def reference(latents, t, y):
        return _block_input(lane.reference_in(latents.dtype), latents, t, y)

    def make_inputs(seed):
        return (lane.latents(seed), *lane.conditioning(seed))

    report = check(kernel_check, lane, lambda *a: _block_input(fast, *a), reference, make_inputs, "patch_embed")
    assert report.passed


@pytest.mark.parametrize("case", lane_params(("default", "batched_conditioning=0"),
                                             ("default", "batched_conditioning=0")))
def test_fast_conditioning_matches_diffusers_embeddings(case, lanes, kernel_check) -> None:
    """Every block's timestep/label embedding and adaLN modulation (hoisted, stacked, batched)."""
    lane, switches = get_lane(lanes, case[0]), case[1]
    fast = lane.fast(switches)
    assert fast.cond.embedders == len(fast.transformer_blocks)  # random weights: one embedder per block

    def reference(t, y):
        import torch
        import torch.nn.functional as F

        blocks = lane.reference_in(t.dtype).transformer_blocks
        embs = [b.norm1.emb(t, y, hidden_dtype=t.dtype) for b in blocks]
        mods = [b.norm1.linear(F.silu(e)) for b, e in zip(blocks, embs)]
        return torch.stack(embs), torch.stack(mods)

    report = check(kernel_check, lane, fast.cond, reference, lane.conditioning, f"conditioning[{switches}]")
    assert report.passed


# -- the final layer: adaLN-modulated norm, projection, unpatchify --------------------------------------

def _final_layer(model: Any, latents: Any, t: Any, y: Any, tokens: Any) -> Any:
    """``model``'s output when its last block returns ``tokens``: only the final layer (and the
    conditioning it reads) acts on them."""
    with hooked(model.transformer_blocks[-1], lambda _m, _a, _out: tokens):
        return model(latents, timestep=t, class_labels=y).sample


@pytest.mark.parametrize("case", lane_params(("default",), ("default",)))
def test_fast_final_layer_matches_diffusers(case, lanes, kernel_check) -> None:
    lane = get_lane(lanes, case[0])
    fast = lane.fast(case[1])

    def reference(latents, t, y, tokens):
        return _final_layer(lane.reference_in(tokens.dtype), latents, t, y, tokens)

    def make_inputs(seed):
        return (lane.latents(seed), *lane.conditioning(seed), lane.tokens(seed))

    report = check(kernel_check, lane, lambda *a: _final_layer(fast, *a), reference, make_inputs, "final_layer")
    assert report.passed


@pytest.mark.parametrize("case", lane_params(("default",), ("default",)))
def test_block_check_rejects_a_dropped_shift(case, lanes, kernel_check, monkeypatch) -> None:
    """Negative control: the same block check fails (``mismatch``) when adaLN modulate drops its shift."""
    from pytest_ditgate.errors import GateFailure

    drop_shift(monkeypatch)
    lane = get_lane(lanes, case[0])
    fast = lane.fast(case[1])

    def candidate(x, t, y):
        return fast.transformer_blocks[0](x, fast.cond(t, y)[1][0])

    def reference(x, t, y):
        return lane.reference_in(x.dtype).transformer_blocks[0](x, timestep=t, class_labels=y)

    with pytest.raises(GateFailure) as info:
        check(kernel_check, lane, candidate, reference, lambda seed: (lane.tokens(seed), *lane.conditioning(seed)),
              "block[dropped shift]")
    assert info.value.reason == "mismatch"
