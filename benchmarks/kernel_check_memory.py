"""What ``check_kernel`` costs at LLM sizes: host and device peak memory and wall time of one whole check of a
4096 x 128256 bf16 cross entropy (issue 50: a 256 MB input used to take 7.6 GB of host memory and a 1 GB one
ran out of memory).

Two cases, each in a fresh child process (so that one's allocator state and loaded kernels do not count in the
other's peak): ``cross_entropy`` (forward and backward by autograd in fp32, the loss and the bf16 gradient
returned) and ``cross_entropy_inplace`` (Liger's contract: the gradient left in the logits, declared with
``inout_args``). Each child first runs the same check at a small size, so that what the first use of each
kernel loads (CUDA modules, torch's lazy imports) is not counted; then it resets the host's peak resident
memory (``/proc/self/clear_refs``) and the CUDA allocator's peak, and runs ``check_kernel`` with its default
trials and extremal trials, the inputs drawn on the device by ``make_tensor``.

Target (CUDA runs): the host's peak resident memory during the check grows by at most 4x the inputs' bytes
(on a CPU the tensors themselves live in host memory, so a CPU run reports it without the target). The device
peak (the CUDA allocator's, during the check) is reported against the inputs too. Timer: the host's
``time.perf_counter`` around the whole call, the device synchronised before and after.

    python benchmarks/kernel_check_memory.py --out benchmarks/results

writes ``kernel_check_memory_<arch>.json`` (with provenance) and ``.txt`` (the table) and exits 1 when a check
fails or the host target is missed. ``--rows 64 --vocab 4096 --device cpu`` runs a small smoke on a CPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import harness

CASES = ("cross_entropy", "cross_entropy_inplace")
#: the host's peak resident memory during a check may grow by at most this many times the inputs' bytes
HOST_TARGET = 4.0
TIMER = ("time.perf_counter around the whole check_kernel call, the device synchronised before and after")


def _status(field: str) -> int | None:
    """A ``/proc/self/status`` field in bytes (``VmRSS``, ``VmHWM``); None off Linux."""
    try:
        with open(f"/proc/{os.getpid()}/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_host_peak() -> bool:
    """Reset this process's peak resident memory (VmHWM) to its current size (Linux 4.0+)."""
    try:
        with open(f"/proc/{os.getpid()}/clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def _functions() -> dict[str, tuple[Any, Any, dict[str, Any]]]:
    """case -> (candidate, reference, check_kernel options): the tolerance corpus's own cross entropy cases
    (tests/plugin/test_tolerance_corpus_llm.py), with check_kernel's default input scales."""
    from tests.plugin.test_tolerance_corpus_llm import ce_fp32, ce_inplace_fp32, ce_inplace_reference, ce_reference

    return {"cross_entropy": (ce_fp32, ce_reference, {}),
            "cross_entropy_inplace": (ce_inplace_fp32, ce_inplace_reference, {"inout_args": (0,)})}


def measure_case(case: str, rows: int, vocab: int, device: str, trials: int | None = None) -> dict[str, Any]:
    """One check of ``case`` at ``rows`` x ``vocab`` on ``device``, after a small warm-up check; its memory and
    time."""
    import torch

    from pytest_ditgate import check_kernel
    from pytest_ditgate.correctness.inputs import make_tensor

    candidate, reference, options = _functions()[case]
    if trials is not None:
        options = {**options, "trials": trials}

    def inputs(n: int, v: int):
        return lambda seed: (make_tensor((n, v), "bfloat16", seed=seed, device=device),
                             make_tensor((n,), "int64", seed=seed + 1, low=0, high=v, device=device))

    def synchronize() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    check_kernel(candidate, reference, inputs(8, 1000), **options)  # loads what the first use of each op loads
    gc.collect()
    synchronize()
    rss_before = _status("VmRSS")
    host_peak_reset = _reset_host_peak()
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    device_before = torch.cuda.memory_allocated() if device.startswith("cuda") else None
    start = time.perf_counter()
    report = check_kernel(candidate, reference, inputs(rows, vocab), **options)
    synchronize()
    seconds = time.perf_counter() - start
    host_peak = _status("VmHWM")
    inputs_bytes = rows * vocab * 2 + rows * 8
    result: dict[str, Any] = {
        "case": case, "rows": rows, "vocab": vocab, "dtype": "bfloat16", "device": device,
        "options": {k: list(v) if isinstance(v, tuple) else v for k, v in options.items()},
        "passed": report.passed, "trials": len(report.trials), "extremal_trials": len(report.extremal_trials),
        "skipped_extremal": [t.skipped for t in report.extremal_trials if t.skipped],
        "seconds": seconds, "timer": TIMER, "inputs_bytes": inputs_bytes,
        "host_rss_before_bytes": rss_before, "host_peak_bytes": host_peak if host_peak_reset else None,
        "host_peak_reset": host_peak_reset, "check_memory": report.memory, "summary": report.summary(),
    }
    if host_peak_reset and host_peak is not None and rss_before is not None:
        result["host_peak_delta_bytes"] = host_peak - rss_before
        result["host_peak_delta_x_inputs"] = (host_peak - rss_before) / inputs_bytes
    if device.startswith("cuda"):
        peak = torch.cuda.max_memory_allocated()
        result.update(device_before_bytes=device_before, device_peak_allocated_bytes=peak,
                      device_peak_x_inputs=peak / inputs_bytes,
                      device_peak_reserved_bytes=torch.cuda.max_memory_reserved())
    return result


def _child(case: str, args: argparse.Namespace) -> dict[str, Any]:
    """``case`` measured in a fresh process (its JSON is the child's last line of stdout)."""
    command = [sys.executable, __file__, "--child", case, "--rows", str(args.rows), "--vocab", str(args.vocab),
               "--device", args.device] + (["--trials", str(args.trials)] if args.trials else [])
    harness.log(f"[{case}] {' '.join(command[1:])}")
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"case": case, "error": f"exit {done.returncode}", "stderr": done.stderr[-4000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(results: list[dict[str, Any]]) -> str:
    gb = 1 << 30
    lines = ["| case | passed | inputs | host peak growth | device peak | time |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['case']} | error: {r['error']} | | | | |")
            continue
        host = (f"{r['host_peak_delta_bytes'] / gb:.2f} GB ({r['host_peak_delta_x_inputs']:.2f}x)"
                if "host_peak_delta_bytes" in r else "not measured")
        device = (f"{r['device_peak_allocated_bytes'] / gb:.2f} GB ({r['device_peak_x_inputs']:.1f}x)"
                  if "device_peak_allocated_bytes" in r else "-")
        lines.append(f"| {r['case']} | {r['passed']} | {r['inputs_bytes'] / gb:.2f} GB | {host} | {device} | "
                     f"{r['seconds']:.1f} s |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="folder for kernel_check_memory_<arch>.json/.txt")
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--trials", type=int, default=None, help="check_kernel's trials (default: its own)")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure_case(args.child, args.rows, args.vocab, args.device, args.trials)))
        return 0
    results = [_child(case, args) for case in args.cases.split(",")]
    text = table(results)
    # on a CPU the tensors themselves are host memory: the host target applies to CUDA runs
    on_cuda = args.device.startswith("cuda")
    missed = [r["case"] for r in results if "error" in r or not r.get("passed")
              or (on_cuda and r.get("host_peak_delta_x_inputs", float("inf")) > HOST_TARGET)]
    record = {"benchmark": "kernel_check_memory", "command": " ".join(["python", *sys.argv]),
              "host_target_x_inputs": HOST_TARGET, "timer": TIMER, "results": results, "missed": missed,
              "environment": harness.environment()}
    if args.out is not None:
        arch = record["environment"]["device"]["arch"]
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"kernel_check_memory_{arch}.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
        (args.out / f"kernel_check_memory_{arch}.txt").write_text(text + "\n")
    print(text)
    if missed:
        print(f"target missed or check failed: {', '.join(missed)}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
