"""Is the DiT block's gated residual worth moving into a quack GEMM epilogue? (issue 18)

Each block of the fast DiT ends its attention and its MLP the same way: a cuBLAS GEMM with bias writes ``y``,
then the seam kernel reads the residual ``x``, the per-(image, channel) gate and ``y`` and writes both
``x_new = x + gate * y`` and the next LayerNorm + modulate ``h`` (four 9.4 MB tensors). quack's epilogue
frontend can compute ``x + gate * (acc + bias)`` inside attention-out and fc2 (the 16 images as the GEMM's
batch ``l``, the gate and bias as per-batch row operands, ``x`` as the GEMM's C), leaving a plain LayerNorm +
modulate (two tensors). ``docs/dit_forward_budget.md`` works out that this saves about 0.24 ms a forward in
memory traffic and costs whatever quack loses to cuBLAS at these shapes (fc2 measured 1.08x autotuned
without the epilogue): this probe measures both, side by side, at the block's shapes:

- ``gemm``: quack with the gated epilogue against cuBLAS ``F.linear`` with bias (what the epilogue costs);
- ``seam``: quack gated GEMM + ``kernels.layernorm_modulate`` against ``F.linear`` +
  ``kernels.gated_residual_layernorm_modulate`` (the whole seam, as the forward would see it).

The forward changes by about 28 x (attention-out's seam difference + fc2's). Every result is checked against
float32 first. Setup on the offline GPU machine: ``benchmarks/gpu/stage_quack.sh`` (three calls), then
``source benchmarks/gpu/setup_env.sh && python3 benchmarks/gpu/quack_seam_probe.py --out seam.json --tuned``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import check_result, log, one_case  # noqa: E402

from block_gemms import (ATTN_OUT, FC2, HIDDEN, IMAGES, TOKENS, expected, measure_graph_or_events,  # noqa: E402
                         of_peak, operands, quack_probe_main, tflops)

CASES = {"attn_out": ATTN_OUT, "fc2": FC2}
EPS = 1e-6


def gated_epilogue() -> Any:
    """quack's epilogue for ``x + gate * (acc + bias)`` (``seam_epilogue.py``, importable by quack's workers)."""
    here = str(Path(__file__).resolve().parent)
    if here not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (os.environ.get("PYTHONPATH"), here)))
    from seam_epilogue import gated_residual

    return gated_residual


class Layout(NamedTuple):
    """How the probe hands quack the shared operands: views without a copy (``True``) or contiguous copies."""

    name: str
    weight_view: bool  # the weight broadcast over the batch with stride 0
    bias_view: bool  # the bias broadcast over the batch with stride 0
    gate_view: bool  # the gate a strided chunk of the [l, 6N] modulation, as the block slices it


#: tried in turn, the model's own views first; copies only where quack refuses a view
LAYOUTS = (Layout("as the model holds them", True, True, True), Layout("bias and gate copied", True, False, False),
           Layout("all copied", False, False, False))


def batched(a: Any, w: Any, bias: Any, residual: Any, gate: Any, layout: Layout) -> dict[str, Any]:
    """The operands in quack's batched form: A [l, m, K], B [l, K, N], C [l, m, N], bias and gate [l, N]."""
    k, n = a.shape[-1], w.shape[0]
    b = w.t().unsqueeze(0).expand(IMAGES, k, n)
    rows = bias.expand(IMAGES, n)
    if layout.gate_view:  # the block's gate is one of six chunks of the modulation row, stride 6N
        modulation = gate.new_zeros(IMAGES, 6 * n)
        modulation[:, 2 * n:3 * n] = gate
        gate = modulation.chunk(6, dim=1)[2]
    return {"A": a.view(IMAGES, TOKENS, k), "B": b if layout.weight_view else b.contiguous(),
            "C": residual.view(IMAGES, TOKENS, n), "bias": rows if layout.bias_view else rows.contiguous(),
            "gate": gate if layout.gate_view else gate.contiguous()}


def calls(ops: dict[str, Any], q: dict[str, Any], scale: Any, shift: Any, tuned: bool) -> dict[str, Any]:
    """The four callables the probe times: quack and cuBLAS GEMMs, and the two whole seams."""
    import torch.nn.functional as F

    from kernels import gated_residual_layernorm_modulate, layernorm_modulate

    epilogue = gated_epilogue()
    a, w, bias, residual, gate = (ops[k] for k in ("a", "w", "bias", "residual", "gate"))
    x3 = residual.view(IMAGES, TOKENS, -1)

    def quack_gemm():
        return epilogue(q["A"], q["B"], q["C"], bias=q["bias"], gate=q["gate"], tuned=tuned)["D"]

    def cublas_gemm():
        return F.linear(a, w, bias)

    def quack_seam():
        x_new = quack_gemm()
        return x_new, layernorm_modulate(x_new, scale, shift, EPS)

    def cublas_seam():
        return gated_residual_layernorm_modulate(x3, gate, cublas_gemm().view_as(x3), scale, shift, EPS)

    return {"quack_gemm": quack_gemm, "cublas_gemm": cublas_gemm, "quack_seam": quack_seam,
            "cublas_seam": cublas_seam}


def run_case(name: str, tuned: bool, rounds: int, results: list[dict]) -> None:
    import torch

    from kernels.reference import layernorm_modulate_ref
    from pytest_ditgate.quality.metrics import rel_l2

    n, k = CASES[name]
    entry: dict[str, Any] = {"case": name, "n": n, "k": k, "tuned": tuned}
    results.append(entry)
    with one_case(entry, "seam", f"{name} tuned={tuned}"):
        ops = operands(n, k, seed=len(results))
        g = torch.Generator(device="cuda").manual_seed(100 + len(results))
        scale, shift = (torch.randn(IMAGES, HIDDEN, device="cuda", generator=g).mul(0.1).bfloat16() for _ in "ss")
        want_x = expected("gated", **ops).view(IMAGES, TOKENS, n)
        want_h = layernorm_modulate_ref(want_x, scale.float(), shift.float(), EPS)  # of the float32 x_new
        for layout in LAYOUTS:
            try:
                fns = calls(ops, batched(**ops, layout=layout), scale, shift, tuned)
                start = time.perf_counter()
                got = fns["quack_gemm"]()
                torch.cuda.synchronize()
                entry["first_call_s"] = round(time.perf_counter() - start, 2)
                entry["layout"] = layout.name
                break
            except Exception as exc:  # noqa: BLE001 - a refused view means trying the next layout
                entry.setdefault("refused", {})[layout.name] = f"{type(exc).__name__}: {str(exc)[:300]}"
        else:
            raise RuntimeError(f"quack refused the gated epilogue in every layout: {entry['refused']}")
        cublas_x, cublas_h = fns["cublas_seam"]()
        _, quack_h = fns["quack_seam"]()
        entry.update(rel_l2_x=rel_l2(got, want_x), cublas_rel_l2_x=rel_l2(cublas_x, want_x),
                     rel_l2_h=rel_l2(quack_h, want_h), cublas_rel_l2_h=rel_l2(cublas_h, want_h))
        check_result(entry["rel_l2_x"], max(4 * entry["cublas_rel_l2_x"], 1e-2),
                     f"float32 x_new (cuBLAS + seam kernel {entry['cublas_rel_l2_x']:.3e})")
        check_result(entry["rel_l2_h"], max(4 * entry["cublas_rel_l2_h"], 1e-2),
                     f"float32 h (cuBLAS + seam kernel {entry['cublas_rel_l2_h']:.3e})")
        for part in ("gemm", "seam"):
            pair = measure_graph_or_events(fns[f"quack_{part}"], fns[f"cublas_{part}"], rounds,
                                          (f"quack {part}", f"cuBLAS {part}"), entry.setdefault(part, {}))
            entry[part].update(mechanism=pair.a.mechanism, quack_ms=pair.a.median_ms, cublas_ms=pair.b.median_ms,
                               ratio=pair.ratio, ratio_interval=[pair.ci_low, pair.ci_high],
                               delta_ms=pair.a.median_ms - pair.b.median_ms)
            log(f"[seam] {name} tuned={tuned} {part}: {pair.describe()}")
        entry["quack_tflops"] = tflops(n, k, entry["gemm"]["quack_ms"])
        entry["cublas_tflops"] = tflops(n, k, entry["gemm"]["cublas_ms"])


def _timed(entry: dict) -> bool:
    """Whether both of a case's pairs were timed (a failed case keeps its errors instead)."""
    return all("delta_ms" in entry.get(part, {}) for part in ("gemm", "seam"))


def table(results: list[dict], peak: float | None) -> list[str]:
    """One row per case, then the forward's projected change per setting of ``tuned``."""
    lines = [f"{'case':<9} {'tuned':<5} {'GEMM quack/cuBLAS ms':>21} {'ratio':>6} {'quack of peak':>13} "
             f"{'seam quack/cuBLAS ms':>21} {'ratio':>6} {'95% interval':>13} {'rel-L2 x/h':>17}  layout"]
    for e in results:
        head = f"{e['case']:<9} {str(e['tuned']):<5}"
        if not _timed(e):
            lines.append(f"{head} {e.get('error', 'not run')[:110]}")
            continue
        gm, sm = e["gemm"], e["seam"]
        low, high = sm["ratio_interval"]
        lines.append(f"{head} {gm['quack_ms']:>10.4f}/{gm['cublas_ms']:<10.4f} {gm['ratio']:>6.3f} "
                     f"{of_peak(e['quack_tflops'], peak):>13} {sm['quack_ms']:>10.4f}/{sm['cublas_ms']:<10.4f} "
                     f"{sm['ratio']:>6.3f} {f'{low:.3f}-{high:.3f}':>13} "
                     f"{e['rel_l2_x']:.1e}/{e['rel_l2_h']:.1e}  {e['layout']}")
    for tuned in (False, True):
        rows = {e["case"]: e for e in results if e["tuned"] == tuned and _timed(e)}
        if set(rows) == set(CASES):
            delta = 28 * sum(rows[c]["seam"]["delta_ms"] for c in CASES)
            lines.append(f"tuned={tuned}: the forward (28 blocks) would change by {delta:+.3f} ms")
    return lines


def main() -> int:
    return quack_probe_main(__doc__.splitlines()[0], CASES, run_case, table)


if __name__ == "__main__":
    raise SystemExit(main())
