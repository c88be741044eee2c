"""Do torch's CUDA cumsum/cumprod accumulate in fp16/bf16? (issue 15's GPU corpus, pytorch#180150/#180155)

For each scan and 16-bit dtype at the corpus's size (2 x 32768, zero-mean inputs; cumprod on 1 + N(0, 0.01^2)):
the rel-norm error of torch's CUDA kernel, of the same op computed in fp32 and cast, and of the CPU kernel,
against float64; then ``check_kernel``'s verdict on torch's CUDA kernel without and with
``compute_dtype=<the dtype>`` (a declared low-precision accumulator).

    python benchmarks/gpu/scan_probe.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import log  # noqa: E402,F401

import torch  # noqa: E402

from pytest_ditgate import GateFailure, check_kernel  # noqa: E402
from pytest_ditgate.correctness.inputs import make_tensor  # noqa: E402


def rel(a, ref):
    return float((a.double() - ref).norm() / ref.norm())


def main() -> None:
    print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())
    for name, op, near_one in (("cumsum", torch.cumsum, False), ("cumprod", torch.cumprod, True)):
        for dtype in (torch.float16, torch.bfloat16):
            def make(seed, dtype=dtype, near_one=near_one):
                t = make_tensor((2, 32768), "float64", seed=seed * 101, device="cuda")
                return ((1 + t / 100) if near_one else t).to(dtype),
            x, = make(0)
            ref = op(x.double(), -1)
            errors = {"cuda": rel(op(x, -1), ref), "fp32 then cast": rel(op(x.float(), -1).to(dtype), ref),
                      "cpu": rel(op(x.cpu(), -1).cuda(), ref)}
            verdicts = {}
            for declared in (None, dtype):
                try:
                    check_kernel(lambda t: op(t, -1), lambda t: op(t, -1), make, trials=10, compute_dtype=declared,
                                 check_determinism=False, poison_memory=False)
                    verdicts[str(declared)] = "pass"
                except GateFailure as failure:
                    verdicts[str(declared)] = f"FAIL {failure.reason}: {failure.message.splitlines()[1][:160]}"
            print(f"{name} {dtype}: rel-norm errors " + ", ".join(f"{k} {v:.2e}" for k, v in errors.items()))
            for k, v in verdicts.items():
                print(f"    compute_dtype={k}: {v}")


if __name__ == "__main__":
    main()
