"""What the GEMM probes share: DiT-XL/2's block GEMMs at batch 16 (8 images with CFG), their operands and
float32 reference, and a record that is rewritten after every case (a killed run keeps what it measured)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

TOKENS, IMAGES, HIDDEN = 256, 16, 1152
M = TOKENS * IMAGES
#: (N, K) of the block's linear layers, nn.Linear's [N, K] weights applied to [M, K] tokens
QKV, ATTN_OUT, FC1, FC2 = (3 * HIDDEN, HIDDEN), (HIDDEN, HIDDEN), (4 * HIDDEN, HIDDEN), (HIDDEN, 4 * HIDDEN)


def operands(n: int, k: int, seed: int) -> dict[str, Any]:
    """bf16 tokens ``a`` [M, K], weight ``w`` [N, K], ``bias`` [N], a residual stream [M, N] and a gate per
    (image, channel) [IMAGES, N], drawn on the GPU from ``seed``."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)

    def draw(*shape: int, scale: float = 1.0) -> "torch.Tensor":
        return (torch.randn(*shape, device="cuda", generator=g) * scale).bfloat16()

    return {"a": draw(M, k), "w": draw(n, k, scale=k ** -0.5), "bias": draw(n, scale=0.1),
            "residual": draw(M, n), "gate": draw(IMAGES, n)}


def expected(epilogue: str, a: Any, w: Any, bias: Any, residual: Any, gate: Any) -> Any:
    """The float32 result of ``epilogue`` (``bias``, ``gelu``: tanh GELU, ``residual``: + residual, ``gated``:
    residual + gate[image] * y) on bf16 operands, as [M, N]."""
    import torch.nn.functional as F

    y = F.linear(a.float(), w.float(), bias.float())
    if epilogue == "gelu":
        return F.gelu(y, approximate="tanh")
    if epilogue == "residual":
        return y + residual.float()
    if epilogue == "gated":
        per_image = y.view(IMAGES, TOKENS, -1)
        return (residual.float().view_as(per_image) + gate.float()[:, None, :] * per_image).view(y.shape)
    return y


def tflops(n: int, k: int, ms: float) -> float:
    """TFLOP/s of one [M, K] x [K, N] GEMM taking ``ms``."""
    return 2.0 * M * n * k / ms / 1e9


def of_peak(rate: float, peak: float | None) -> str:
    """``rate`` as a share of the measured GEMM ``peak``, or "-" where the device has no measured peak."""
    return f"{rate / peak:.0%}" if peak else "-"


def write_record(path: Path | None, results: list[dict[str, Any]], **fields: Any) -> None:
    """The probe's JSON record with the machine's provenance, rewritten after every case."""
    if path is None:
        return
    from harness import environment

    path.write_text(json.dumps({"results": results, **fields, "environment": environment()}, indent=1, default=str))


def measure_graph_or_events(a_call: Callable[[], Any], b_call: Callable[[], Any], rounds: int,
                            labels: tuple[str, str], entry: dict[str, Any]) -> Any:
    """``measure_pair`` of two calls on the CUDA-graph timer, or on events where a DSL's launch cannot be
    captured; a timer that failed leaves ``<mechanism>_error`` in ``entry`` (``a.mechanism`` says which ran)."""
    from pytest_ditgate.bench.runner import measure_pair

    for mechanism in ("graph", "events"):
        try:
            return measure_pair(a_call, b_call, mechanism=mechanism, warmup=10, rounds=rounds, labels=labels)
        except Exception as exc:  # noqa: BLE001 - any failure of one timer means trying the next
            entry[f"{mechanism}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    raise RuntimeError("neither the graph nor the events timer could time it")


def quack_probe_main(description: str, cases: dict[str, Any], run_case: Callable[..., None],
                     table: Callable[[list[dict[str, Any]], float | None], list[str]]) -> int:
    """The command line the quack probes share: ``--cases``, ``--rounds``, ``--tuned`` (default configurations,
    then autotuned ones) and ``--out``, the record rewritten after every case, the probe's table last."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--cases", default=",".join(cases))
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--tuned", action="store_true", help="also time quack's autotuned configurations")
    args = parser.parse_args()

    import quack
    import torch

    from harness import gemm_peak_tflops

    torch.backends.cuda.matmul.allow_tf32 = False
    peak, peak_source = gemm_peak_tflops()
    results: list[dict[str, Any]] = []
    for tuned in ((False, True) if args.tuned else (False,)):
        for name in args.cases.split(","):
            run_case(name, tuned, args.rounds, results)
            write_record(args.out, results, quack=getattr(quack, "__version__", "?"), gemm_peak_tflops=peak,
                         gemm_peak_source=peak_source,
                         timer="pytest_ditgate measure_pair, interleaved rounds (graph, else events, per case)")
    print("\n".join(table(results, peak)))
    return 0
