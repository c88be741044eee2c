#!/usr/bin/env python3
"""Every experiment class through the documented loop (docs/agent_loop.md): an honest and a harmful candidate of
each, judged by ``ditgate experiment`` in a temporary git repository of this project, exit codes checked.

Copies the working tree (no .git, caches or virtual environments) into a temporary folder, commits it and
records the DiT lane's baseline there (``ditgate baseline --lane dit``). Each candidate then runs in its own copy
of that baselined repository (so every verdict is against the baseline's best, whatever came before): its edit
is committed and judged with ``ditgate experiment --lane ... --class ... --description ...``. On a CUDA GPU the
kernel lane gets the same treatment (``ditgate baseline --lane kernels``). The class each candidate is judged
as comes from the verdict (``classification.effective``) and is checked too.

| candidate                                   | claims       | judged as    | expected (GPU)  | expected (CPU) |
|---------------------------------------------|--------------|--------------|-----------------|----------------|
| numerical: fp16                             | numerical    | numerical    | 0 or 11         | 11             |
| numerical: TF32 (float32, TF32 forward)     | numerical    | numerical    | 0 or 11         | 11             |
| numerical harmful: attention logits x1.02   | numerical    | numerical    | 10              | 10             |
| approximate: the fewest steps accepted      | approximate  | approximate  | 0               | 0 or 11        |
| approximate harmful: most steps refused     | numerical    | approximate  | 10              | 10             |
| quantization: fp8 GEMMs on a kept speedup    | quantization | quantization | 0 (sm_89+)      | 10 or 11       |
| quantization: int8 weight-only              | quantization | quantization | 11              | 10 or 11       |
| quantization harmful: int4 without scales   | numerical    | quantization | 10              | 10             |
| kernels: the fused seam                     | numerical    | numerical    | 0               | (no GPU: none) |
| kernels harmful: the seam without its gate  | numerical    | numerical    | 10              | (no GPU: none) |
| kernels: an empty commit                    | numerical    | numerical    | 11              | (no GPU: none) |

Why the CPU differs: the CPU lane runs every candidate in float32 (``options_for``), so fp16 and TF32 change
nothing there and are 11; fp8 GEMMs are emulated by float GEMMs of the same roundings (no speed: 11 if quality
holds, else 10, as the calibration's data says); the sampling is timed on the host clock, where a halved
sampling may still read within the noise (0 or 11); the kernels need CUDA. The quantization candidate on a GPU
first keeps a speedup that keeps the algorithm (CUDA graphs, adaLN kernels, cuDNN attention, the GELU epilogue: expected 0) and
adds fp8 GEMMs on top, as an agent would; on the CPU that first step is 11 and fp8 is judged against the
baseline. The approximate step counts come from the calibration (``--honest-fraction``,
``--harmful-steps``; docs/quality_calibration.md).

Writes a JSON record (``--json``: every candidate's exit code, judged class, first reasons and the notes of
cases judged on their structure only) and exits 1 when any expectation fails.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_loop_check import (HONEST, Loop, picked, project_repository, run_in_scratch,  # noqa: E402 - the loop's
                              tree_commit, verdict_of, write_record)  # repository and commands

CANDIDATE = "dit_impl/fast/candidate.py"
ATTENTION = "dit_impl/fast/attention.py"
KERNEL_LANE = "kernels/lane.py"
#: where a candidate's change of ``OPTIONS`` goes (after its definition)
SAMPLER_LINE = "\n#: how the candidate samples a corpus case"
#: the approximate candidates by default, from the CPU's calibration of its shapes case (10 images, 20 paired seed
#: sets; benchmarks/results/shapes_classes_cpu.json): a fifth of every case's steps, the fewest it accepts (4 of 20,
#: refused in 1 seed set of 10, accepted at the case's seed; 10 of the GPU case's 50, which its 1000-image
#: measurement finds 1.4 Frechet points worse, within that case's spread), and 2 steps, the most it refuses at the
#: case's seed and in every seed set (3 steps are refused in 70 % of the sets but not at the case's seed)
HONEST_FRACTION = 0.2
HARMFUL_STEPS = 2


@dataclass
class Candidate:
    name: str
    lane: str
    claims: str
    judged: str
    expected: dict[str, tuple[int, ...]]  # "gpu" / "cpu" -> allowed exit codes
    edits: list[Callable[[Loop], None]] = field(default_factory=list)
    #: commits judged before the candidate (each with its expected codes), as an agent would keep them first
    before: list[tuple[str, Callable[[Loop], None], dict[str, tuple[int, ...]]]] = field(default_factory=list)
    gpu_only: bool = False
    needs_fp8: bool = False


def replace_all(loop: Loop, path: str, old: str, new: str) -> None:
    file = loop.work / path
    text = file.read_text()
    if old not in text:
        raise RuntimeError(f"{path}: the text to replace is not there")
    file.write_text(text.replace(old, new))


def options(change: str) -> Callable[[Loop], None]:
    """Change fields of the candidate's OPTIONS (``change``: ``quant="fp8"``)."""
    return lambda loop: loop.edit(CANDIDATE, SAMPLER_LINE, f"OPTIONS = OPTIONS.replace({change})\n{SAMPLER_LINE}")


def honest_best(loop: Loop) -> None:
    loop.edit(CANDIDATE, *HONEST)


def sampler(change: str) -> Callable[[Loop], None]:
    return lambda loop: loop.edit(CANDIDATE, "SAMPLER = SamplerOptions()", f"SAMPLER = SamplerOptions({change})")


def scale_bug(loop: Loop) -> None:
    replace_all(loop, ATTENTION, "F.scaled_dot_product_attention(q, k, v)",
                "F.scaled_dot_product_attention(q, k, v, scale=1.02 * q.shape[-1] ** -0.5)")


def fused_seam(loop: Loop) -> None:
    loop.edit(KERNEL_LANE, 'SEAM = "separate"', 'SEAM = "fused"')


def gateless_seam(loop: Loop) -> None:
    loop.edit(KERNEL_LANE, "x_new = kernels.gated_residual(x, gate, y)",
              "x_new = kernels.gated_residual(x, gate * 0 + 1, y)")


def candidates(honest_fraction: float, harmful_steps: int) -> list[Candidate]:
    after_best = [("a speedup first (CUDA graphs, adaLN kernels, cuDNN SDPA, GELU epilogue)", honest_best,
                   {"gpu": (0,), "cpu": (11,)})]
    return [
        Candidate("numerical: fp16", "dit", "numerical", "numerical", {"gpu": (0, 11), "cpu": (11,)},
                  [options('dtype="float16"')]),
        Candidate("numerical: TF32 (float32 forward in TF32)", "dit", "numerical", "numerical",
                  {"gpu": (0, 11), "cpu": (11,)}, [options('dtype="float32", tf32=True')]),
        Candidate("numerical harmful: attention logits x1.02", "dit", "numerical", "numerical",
                  {"gpu": (10,), "cpu": (10,)}, [scale_bug]),
        Candidate(f"approximate: step_fraction={honest_fraction}", "dit", "approximate", "approximate",
                  {"gpu": (0,), "cpu": (0, 11)}, [sampler(f"step_fraction={honest_fraction}")]),
        Candidate(f"approximate harmful: steps={harmful_steps}, claimed numerical", "dit", "numerical",
                  "approximate", {"gpu": (10,), "cpu": (10,)}, [sampler(f"steps={harmful_steps}")]),
        Candidate("quantization: fp8 GEMMs on a kept speedup", "dit", "quantization", "quantization",
                  {"gpu": (0,), "cpu": (10, 11)}, [options('quant="fp8"')], before=after_best, needs_fp8=True),
        Candidate("quantization: int8 weight-only", "dit", "quantization", "quantization",
                  {"gpu": (11,), "cpu": (10, 11)}, [options('quant="int8_weight"')]),
        Candidate("quantization harmful: int4 without scales, claimed numerical", "dit", "numerical", "quantization",
                  {"gpu": (10,), "cpu": (10,)}, [options('quant="int4_noscale"')]),
        Candidate("kernels: the fused seam", "kernels", "numerical", "numerical", {"gpu": (0,)}, [fused_seam],
                  gpu_only=True),
        Candidate("kernels harmful: the seam without its gate", "kernels", "numerical", "numerical", {"gpu": (10,)},
                  [gateless_seam], gpu_only=True),
        Candidate("kernels: an empty commit", "kernels", "numerical", "numerical", {"gpu": (11,)}, [], gpu_only=True),
    ]



def judge(loop: Loop, lane: str, cls: str, description: str, edits: list[Callable[[Loop], None]]) -> tuple[int, dict]:
    for edit in edits:
        edit(loop)
    loop.git("commit", "-q", "--allow-empty", "-am", description)
    code = loop.ditgate("experiment", "--lane", lane, "--class", cls, "--description", description)
    return code, verdict_of(loop)


def summary(code: int, verdict: dict) -> dict:
    quality = verdict.get("quality") or []
    return {"exit": code, "judged": (verdict.get("classification") or {}).get("effective"),
            "reasons": list((verdict.get("verdict") or {}).get("reasons") or [])[:3],
            "objective": ((verdict.get("verdict") or {}).get("objective") or {}).get("ratio"),
            "notes": sorted({q["judged_on"] for q in quality if q.get("judged_on")}),
            "quality": {f"{q.get('case')}@{q.get('key')}": q.get("passed") for q in quality}}


def run(base: Path, log, device: str, fp8: bool, chosen: list[Candidate]) -> list[dict]:
    targets: list[dict] = []

    def expect(name: str, result: dict, allowed: tuple[int, ...], judged: str | None = None) -> None:
        ok = result["exit"] in allowed and (judged is None or result["judged"] == judged)
        targets.append({"name": name, **result, "expected": list(allowed), "expected_class": judged, "pass": ok})
        print(f"{'PASS' if ok else 'FAIL'}  {name}: exit {result['exit']} (expected {' or '.join(map(str, allowed))})"
              + (f", judged {result['judged']} (expected {judged})" if judged else "")
              + ("" if ok else ": " + "; ".join(result["reasons"][:2])[:600]), flush=True)

    templates: dict[str, Path] = {}
    for lane in sorted({c.lane for c in chosen}):
        root = base / f"template-{lane}"
        code = project_repository(root, log).ditgate("baseline", "--lane", lane)
        expect(f"baseline, lane {lane}", {"exit": code, "judged": None, "reasons": [], "objective": None,
                                          "notes": [], "quality": {}}, (0,))
        if code == 0:
            templates[lane] = root
    for index, candidate in enumerate(chosen):
        if candidate.lane not in templates:
            continue
        if candidate.needs_fp8 and device == "gpu" and not fp8:  # the CPU lane emulates them
            print(f"SKIP  {candidate.name}: fp8 GEMMs need sm_89 or newer", flush=True)
            continue
        work = base / f"candidate-{index}"
        shutil.copytree(templates[candidate.lane], work, symlinks=True)
        loop = Loop(work, log)
        for description, edit, allowed in candidate.before:
            code, verdict = judge(loop, candidate.lane, "numerical", description, [edit])
            expect(f"{candidate.name} / {description}", summary(code, verdict), allowed[device])
            if code != 0:
                loop.discard()
        code, verdict = judge(loop, candidate.lane, candidate.claims, candidate.name, candidate.edits)
        expect(candidate.name, summary(code, verdict), candidate.expected[device], candidate.judged)
        shutil.rmtree(work, ignore_errors=True)
    return targets


def select(found: list[Candidate], on_gpu: bool, only: str | None, lane: str | None,
           pick: str | None = None) -> list[Candidate]:
    """The candidates this machine can judge (no GPU-only one on a CPU), by name (``only``), by lane, and by
    1-based position among those (``pick``, ``FIRST-LAST``: a shard of the GPU check's stage)."""
    return picked([c for c in found if (on_gpu or not c.gpu_only) and (only is None or only in c.name)
                   and (lane is None or c.lane == lane)], pick)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None, help="write the record here (and the log beside it)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary repositories")
    parser.add_argument("--honest-fraction", type=float, default=HONEST_FRACTION,
                        help="the approximate candidate's SamplerOptions.step_fraction")
    parser.add_argument("--harmful-steps", type=int, default=HARMFUL_STEPS,
                        help="the harmful approximate candidate's SamplerOptions.steps")
    parser.add_argument("--only", default=None, help="run only the candidates whose name contains this text")
    parser.add_argument("--lane", choices=("dit", "kernels"), default=None,
                        help="run only this lane's candidates (and only its baseline)")
    parser.add_argument("--pick", default=None, metavar="FIRST-LAST",
                        help="of the candidates chosen, run only those at these 1-based positions")
    ns = parser.parse_args(argv)
    import torch

    on_gpu = torch.cuda.is_available()
    fp8 = on_gpu and torch.cuda.get_device_capability(0) >= (8, 9)
    device = "gpu" if on_gpu else "cpu"
    chosen = select(candidates(ns.honest_fraction, ns.harmful_steps), on_gpu, ns.only, ns.lane, ns.pick)
    started = time.time()
    commit = tree_commit()
    targets, error, base = run_in_scratch("classes", lambda base, log: run(base, log, device, fp8, chosen), [])
    record = {"targets": targets, "error": error, "seconds": round(time.time() - started, 1), "device": device,
              "fp8_gemms": fp8, "honest_fraction": ns.honest_fraction, "harmful_steps": ns.harmful_steps,
              "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(0) if on_gpu else None,
              "commit": commit}
    if ns.json:
        write_record(record, ns.json, base, base / "classes.log")
    if not ns.keep:
        shutil.rmtree(base, ignore_errors=True)
    if error:
        print(f"classes run broke: {error}", file=sys.stderr)
    return 0 if targets and all(t["pass"] for t in targets) and not error else 1


if __name__ == "__main__":
    raise SystemExit(main())
