"""Where do the first and second calls of the compiled, seamed fast DiT differ? (the compile-twice flake)

``tests/dit_fast/test_fast_gpu.py::test_switch_matches_diffusers_within_bf16_error[compile=blocks,block_seam=1]``
failed twice on the H200, both times in the first suites run of a fresh machine: the second call's output
differed from the first's by rel-L2 3.0e-3 and 2.97e-3, with dynamo compiling 2 frames and 2 graphs in the
first call and nothing in the second. Reruns on the same machine passed. This probe runs the test's model
(DiT-XL/2 blocks, 4 layers, the test's weights and inputs) in fresh processes, each with its own inductor and
Triton cache folder, first cold (empty) and then warm (the same folder again), and for each process:

- calls the compiled forward three times and compares every block's outputs (``x`` and, seamed, ``h``)
  between calls 1 and 2 and between 2 and 3, bit for bit: it names the first block and tensor that differ;
- records each call's rel-L2 against diffusers in float32 (TF32 off), beside diffusers' own bf16 error, so
  the odd call is known;
- records every Triton autotuning inductor ran (kernel, number of candidate configurations, the winner) with
  the call and block it ran in, and dynamo's frames and graphs per call.

    python3 benchmarks/gpu/compile_twice_probe.py --out compile_twice.json [--trials 2] [--control 1]

``--control`` adds cold runs of ``compile=blocks`` without the seam (it never failed). The JSON is rewritten
after every process (a device call cut off at its limit keeps what ran), and the table is printed last;
``--budget-s`` starts no process that could not finish inside it. It also says whether an output kept
un-cloned from one call was changed by a later call (the test keeps its first output that way), and, for the
first block that differs, whether its inputs already differed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import environment, log  # noqa: E402

SEAMED = "compile=blocks,block_seam=1"
CONTROL = "compile=blocks"
#: the test module's configuration: DiT-XL/2 block shapes with 4 layers
CONFIG = dict(num_attention_heads=16, attention_head_dim=72, in_channels=4, out_channels=8, num_layers=4,
              sample_size=32, patch_size=2, num_embeds_ada_norm=1000, norm_type="ada_norm_zero")
#: switches the test module runs before the seamed compile case, so the process is in a like state
BEFORE = ("sdpa=cudnn", "adaln=kernels,cuda_graphs=1,gelu_epilogue=1,sdpa=cudnn,block_seam=1")
CALLS = 3


# ----------------------------------------------------------------------------------------------- child


class Recorder:
    """Each block's outputs per call, and inductor's autotuning events with the call and block they ran in."""

    def __init__(self) -> None:
        self.call = 0
        self.block: int | None = None
        self.outputs: list[list[tuple[Any, ...]]] = []
        self.inputs: list[list[tuple[Any, ...]]] = []
        self.autotunes: list[dict[str, Any]] = []

    def start_call(self) -> None:
        self.call += 1
        self.outputs.append([])
        self.inputs.append([])


def wrap_blocks(model: Any, recorder: Recorder) -> None:
    """Put an eager recording shell around each (already compiled) block: the compiled graphs stay as they are."""
    import torch.nn as nn

    class Recording(nn.Module):
        def __init__(self, inner: nn.Module, index: int) -> None:
            super().__init__()
            self.inner, self.index = inner, index

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            given = [args[0], kwargs.get("h")]  # the residual stream and, seamed, the normalised input
            recorder.inputs[-1].append(tuple(t.detach().clone() for t in given if t is not None))
            recorder.block = self.index
            out = self.inner(*args, **kwargs)
            recorder.block = None
            outs = out if isinstance(out, tuple) else (out,)
            recorder.outputs[-1].append(tuple(o.detach().clone() for o in outs))
            return out

    blocks = model.transformer_blocks
    for i in range(len(blocks)):
        blocks[i] = Recording(blocks[i], i)


def watch_autotuning(recorder: Recorder) -> str:
    """Record every ``CachingAutotuner.autotune_to_one_config`` (inductor's first-launch benchmark of a kernel's
    candidate configurations). Returns what was patched, or why nothing was."""
    try:
        from torch._inductor.runtime import triton_heuristics as th
    except ImportError as exc:
        return f"not watched: {exc}"
    original = getattr(th.CachingAutotuner, "autotune_to_one_config", None)
    if original is None:
        return "not watched: CachingAutotuner.autotune_to_one_config is missing in this torch"

    def watched(self: Any, *args: Any, **kwargs: Any) -> Any:
        candidates = [str(getattr(launcher, "config", "?")) for launcher in getattr(self, "launchers", [])]
        result = original(self, *args, **kwargs)
        chosen = [str(getattr(launcher, "config", "?")) for launcher in getattr(self, "launchers", [])]
        name = (getattr(self, "inductor_meta", {}) or {}).get("kernel_name") or getattr(
            getattr(self, "fn", None), "__name__", "?")
        recorder.autotunes.append({"call": recorder.call, "block": recorder.block, "kernel": name,
                                   "candidates": candidates, "chosen": chosen})
        return result

    th.CachingAutotuner.autotune_to_one_config = watched
    return "watched"


def dynamo_counts() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {"frames": counters["frames"]["ok"], "graphs": counters["stats"]["unique_graphs"],
            "graph_breaks": sum(counters["graph_break"].values())}


def same_bits(x: Any, y: Any) -> bool:
    """Bit for bit (NaNs with the same bits are equal, -0 and +0 are not), not ``==``."""
    import torch

    return x.shape == y.shape and x.dtype == y.dtype and torch.equal(
        x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8))


def first_difference(recorder: Recorder, a: int, b: int, names: tuple[str, ...]) -> dict[str, Any]:
    """The first block and tensor whose outputs differ bit for bit between calls ``a`` and ``b`` (0-based),
    with its rel-L2, and whether that block's inputs were already different."""
    from pytest_ditgate.quality.metrics import rel_l2

    for index, (left, right) in enumerate(zip(recorder.outputs[a], recorder.outputs[b])):
        for name, x, y in zip(names, left, right):
            if not same_bits(x, y):
                inputs = zip(recorder.inputs[a][index], recorder.inputs[b][index])
                return {"block": index, "tensor": name, "rel_l2": rel_l2(y, x),
                        "max_abs": float((x.float() - y.float()).abs().max()),
                        "inputs_equal": all(same_bits(u, v) for u, v in inputs)}
    return {"block": None}


def strict(text: str) -> Any:
    """The test's options for a switch set: a fall-back of a GPU switch fails, never runs silently."""
    from dit_impl.fast import FastOptions

    options = FastOptions.parse(text)
    return options.replace(strict=True) if options.adaln == "kernels" or options.gemm != "cublas" else options


def child(switches: str, device: str) -> dict[str, Any]:
    import torch
    from diffusers import DiTTransformer2DModel

    from dit_impl.baseline.weights import init_random_
    from dit_impl.fast import fast_transformer
    from pytest_ditgate.quality.metrics import rel_l2

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    with torch.device(device):
        ref = DiTTransformer2DModel(**CONFIG)
    init_random_(ref, 4)
    ref.eval().requires_grad_(False)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(8, 4, 32, 32, generator=generator).to(device)
    t = torch.tensor([700] * 8, device=device)
    y = torch.tensor([1, 2, 3, 4, 1000, 1000, 1000, 1000], device=device)
    with torch.inference_mode():
        expected = ref(x, timestep=t, class_labels=y).sample
        ref_bf16 = type(ref)(**ref.config).to(device, torch.bfloat16).eval()
        ref_bf16.load_state_dict(ref.state_dict())
        baseline = rel_l2(ref_bf16(x.bfloat16(), timestep=t, class_labels=y).sample, expected)
    before_reports = []
    for before in BEFORE if device == "cuda" else ():  # the test module's earlier cases, built as it builds them
        model = fast_transformer(ref, strict(before))
        with torch.inference_mode():
            model(x.to(model.dtype), timestep=t, class_labels=y)
        before_reports.append(model.report())
        del model

    recorder = Recorder()
    watching = watch_autotuning(recorder)
    model = fast_transformer(ref, strict(switches))
    wrap_blocks(model, recorder)
    kept, outputs, counts, seconds = [], [], [dynamo_counts()], []
    with torch.inference_mode():
        for _ in range(CALLS):
            recorder.start_call()
            start = time.perf_counter()
            out = model(x.to(model.dtype), timestep=t, class_labels=y).sample
            kept.append(out)  # un-cloned, as the test keeps its first output through the second call
            outputs.append(out.clone())
            if device == "cuda":
                torch.cuda.synchronize()
            seconds.append(round(time.perf_counter() - start, 2))
            counts.append(dynamo_counts())
    names = ("x", "h") if "block_seam=1" in switches else ("x",)
    return {
        "switches": switches, "autotuning": watching, "seconds": seconds, "before": before_reports,
        "report": model.report(),
        "dynamo_per_call": [{k: after[k] - before[k] for k in before} for before, after in zip(counts, counts[1:])],
        "baseline_bf16_rel_l2": baseline, "bound": max(2 * baseline, 2e-3),
        "rel_l2_vs_float32": [rel_l2(out, expected) for out in outputs],
        "changed_after_its_call": [not same_bits(a, b) for a, b in zip(kept, outputs)],
        "calls_1_2": {**first_difference(recorder, 0, 1, names), "output_rel_l2": rel_l2(outputs[1], outputs[0])},
        "calls_2_3": {**first_difference(recorder, 1, 2, names), "output_rel_l2": rel_l2(outputs[2], outputs[1])},
        "autotunes": recorder.autotunes,
    }


# ---------------------------------------------------------------------------------------------- parent


#: marks the child's result line on stdout (a library may print lines of its own)
RESULT = "@@compile_twice_result@@ "


def run_child(switches: str, cache: Path, timeout: float, device: str) -> dict[str, Any]:
    """One fresh process with its inductor and Triton caches under ``cache``."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"), TRITON_CACHE_DIR=str(cache / "triton"))
    command = [sys.executable, __file__, "--child", switches, "--device", device]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-600:]
        tail = tail.decode("utf-8", "replace") if isinstance(tail, bytes) else tail
        return {"switches": switches, "error": f"timed out after {timeout:.0f} s: {tail.strip()}"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(RESULT):
            try:
                return {**json.loads(line[len(RESULT):]), "returncode": done.returncode}
            except json.JSONDecodeError as exc:
                return {"switches": switches, "error": f"unreadable result ({exc}): {line[:300]}"}
    return {"switches": switches, "error": f"exit {done.returncode}: {done.stderr.strip()[-600:]}"}


def describe(diff: dict[str, Any]) -> str:
    """One comparison of two calls: the first block that differs (and whether its inputs did), the output's."""
    if "block" not in diff:
        return "-"
    out = f"out {diff['output_rel_l2']:.1e}"
    if diff["block"] is None:
        return f"blocks identical, {out}"
    inputs = "inputs equal" if diff.get("inputs_equal") else "inputs differ"
    return f"block {diff['block']} {diff['tensor']} {diff['rel_l2']:.1e} ({inputs}), {out}"


def table(runs: list[dict[str, Any]]) -> list[str]:
    lines = [f"{'switches':<28} {'cache':<11} {'calls 1 vs 2':<52} {'calls 2 vs 3':<40} "
             f"{'rel-L2 vs fp32 (call 1/2/3)':<30} {'bound':>8}  changed later  frames/call  autotuned/call"]
    for run in runs:
        head = f"{run['switches']:<28} {run['cache']:<11}"
        if "error" in run:
            lines.append(f"{head} {run['error'][:200]}")
            continue
        errors = "/".join(f"{e:.2e}" for e in run["rel_l2_vs_float32"])
        changed = "/".join("yes" if c else "no" for c in run["changed_after_its_call"])
        frames = "/".join(str(d["frames"]) for d in run["dynamo_per_call"])
        tuned = ("n/a" if run["autotuning"] != "watched" else
                 "/".join(str(sum(1 for a in run["autotunes"] if a["call"] == c)) for c in range(1, CALLS + 1)))
        lines.append(f"{head} {describe(run['calls_1_2']):<52} {describe(run['calls_2_3']):<40} {errors:<30} "
                     f"{run['bound']:>8.2e}  {changed:<13}  {frames:<11}  {tuned}")
    return lines


def write(out: Path | None, runs: list[dict[str, Any]], env: dict[str, Any]) -> None:
    """The record so far (rewritten after every process: a call cut off at its limit keeps what ran)."""
    if out is None:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "compile_twice_probe", "environment": env, "config": CONFIG,
                               "before": BEFORE, "runs": runs, "table": table(runs)}, indent=1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", metavar="SWITCHES", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help="JSON file for every run")
    parser.add_argument("--trials", type=int, default=2, help="cold-then-warm pairs of the seamed case")
    parser.add_argument("--control", type=int, default=1, help="cold runs of compile=blocks without the seam")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds for one process")
    parser.add_argument("--budget-s", type=float, default=540.0,
                        help="start no process that could not finish (its timeout) inside this many seconds")
    parser.add_argument("--device", default="cuda", help="cuda (the flake's home); cpu only checks the probe runs")
    args = parser.parse_args()
    if args.child:
        print(RESULT + json.dumps(child(args.child, args.device)), flush=True)
        return 0

    try:
        env = environment()
    except Exception as exc:  # noqa: BLE001 - the provenance must not cost the runs
        env = {"error": f"{type(exc).__name__}: {exc}"}
    started = time.perf_counter()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="compile_twice_") as scratch:
        plan = [(SEAMED, f"trial{i}", cache) for i in range(args.trials) for cache in ("cold", "warm")]
        plan += [(CONTROL, f"control{i}", "cold") for i in range(args.control)]
        failed: set[str] = set()
        for switches, folder, cache in plan:
            if time.perf_counter() - started + args.timeout > args.budget_s:
                runs.append({"switches": switches, "cache": cache, "error": "not run: the budget would not hold it"})
                continue
            label = "warm*" if cache == "warm" and folder in failed else cache  # * its cold run failed
            log(f"[compile_twice] {switches}, {label} cache ({folder}) ...")
            run = run_child(switches, Path(scratch) / folder, args.timeout, args.device)
            run["cache"] = label
            if "error" in run:
                failed.add(folder)
            runs.append(run)
            write(args.out, runs, env)
            log(f"[compile_twice]   -> {table([run])[1]}")
    write(args.out, runs, env)
    print("\n".join(table(runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
