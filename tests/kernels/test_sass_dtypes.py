"""The bf16 kernels compile to the same machine code shape as fp16 (sm_90): no CPU test can time them, so
this guards what made bf16 15-25 % slower on the H200 — more registers, spills, and 16-bit splits (PRMT)
placed right after loads, which serialised the loads of a thread.

Compiles the real sources once per (op, dtype) with nvcc to a cubin (ptxas -v for registers and spills);
the SASS checks need ``cuobjdump`` (CUDA toolkit or triton's copy) and are skipped without it.
"""

from __future__ import annotations

import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.kernels.conftest import find_cuobjdump, needs_nvcc

pytestmark = [needs_nvcc, pytest.mark.slow]

#: kernels DiT sizes use: the vectorised gated residual, the warp LN+modulate kernels up to K=5 (H=1152)
HOT = (r"gated_residual_vec_kernel", r"adaln_warp_kernel(_3blocks)?I[^L]+Li[1-5]E")


def _compile(nvcc: str, op: str, dtype: str, work: Path) -> tuple[str, Path]:
    from kernels.modules import CSRC, OPS, config_header, gen_spec

    gen = work / dtype
    gen.mkdir(parents=True, exist_ok=True)
    (gen / "ditgate_config.h").write_text(config_header(dtype))
    cubin = work / f"{op}.{dtype}.cubin"
    flags = gen_spec(op, dtype).semantic_cflags()  # the flags of the real build
    done = subprocess.run([nvcc, *flags, "-gencode", "arch=compute_90,code=sm_90", f"-I{CSRC}", f"-I{gen}",
                           "-Xptxas", "-v", "-cubin", "-o", str(cubin), str(CSRC / OPS[op])],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"nvcc failed on {OPS[op]} ({dtype}):\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr, cubin


def _usage(ptxas_log: str) -> dict[str, tuple[int, int]]:
    """kernel -> (registers, spill bytes stored + loaded) from ``ptxas -v``."""
    out, name = {}, None
    for line in ptxas_log.splitlines():
        if m := re.search(r"Compiling entry function '(\S+)'", line):
            name = m.group(1)
        elif name and (m := re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)):
            out[name] = (0, int(m.group(1)) + int(m.group(2)))
        elif name and (m := re.search(r"Used (\d+) registers", line)):
            out[name] = (int(m.group(1)), out.get(name, (0, 0))[1])
    return out


def _sass(cuobjdump: str, cubin: Path) -> dict[str, list[str]]:
    """kernel -> opcodes (predicates stripped)."""
    text = subprocess.run([cuobjdump, "--dump-sass", str(cubin)], capture_output=True, text=True, check=True,
                          timeout=300).stdout
    out, name = {}, None
    for line in text.splitlines():
        if m := re.search(r"Function : (\S+)", line):
            name = m.group(1)
            out[name] = []
        elif name and (m := re.search(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][\w.]*)", line)):
            out[name].append(m.group(1))
    return out


def _pairs(names) -> dict[str, tuple[str, str]]:
    """fp16 and bf16 instantiations of the same hot kernel template, keyed by the fp16 name."""
    pairs = {}
    for name in names:
        if "6__half" in name and any(re.search(p, name) for p in HOT):
            twin = name.replace("6__half", "13__nv_bfloat16")
            if twin in names:
                pairs[name] = (name, twin)
    return pairs


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict:
    from kernels.jit.toolkit import find_toolkit

    toolkit = find_toolkit()
    work = tmp_path_factory.mktemp("sass")
    jobs = [(op, dtype) for op in ("gated_residual", "adaln") for dtype in ("fp16", "bf16")]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda job: _compile(toolkit.nvcc, *job, work), jobs))
    usage, cubins = {}, {}
    for (op, dtype), (log, cubin) in zip(jobs, results):
        usage.update(_usage(log))
        cubins[(op, dtype)] = cubin
    return {"usage": usage, "cubins": cubins, "cuobjdump": find_cuobjdump(toolkit.root)}


def test_bf16_hot_kernels_use_the_registers_of_fp16_and_never_spill(builds) -> None:
    pairs = _pairs(builds["usage"])
    assert len(pairs) >= 2 + 5 + 5, f"hot kernels not found in ptxas output: {sorted(builds['usage'])}"
    for fp16, bf16 in pairs.values():
        (r16, s16), (rb, sb) = builds["usage"][fp16], builds["usage"][bf16]
        assert s16 == 0 and sb == 0, f"spills: {fp16} {s16} B, {bf16} {sb} B"
        assert rb <= r16 + 4, f"{bf16} uses {rb} registers, its fp16 twin {r16}"


def test_bf16_hot_kernels_have_no_16bit_splits_or_local_memory(builds) -> None:
    if builds["cuobjdump"] is None:
        pytest.skip("no cuobjdump (CUDA toolkit bin/ or triton's bundled copy)")
    sass = {}
    for cubin in builds["cubins"].values():
        sass.update(_sass(builds["cuobjdump"], cubin))
    pairs = _pairs(sass)
    assert pairs, f"hot kernels not found in the SASS: {sorted(sass)}"
    for fp16, bf16 in pairs.values():
        ops16, opsb = sass[fp16], sass[bf16]
        bad = [op for op in opsb if op == "PRMT" or op.startswith(("STL", "LDL"))]
        assert not bad, f"{bf16}: {len(bad)} PRMT/local-memory instructions ({sorted(set(bad))})"
        wide = [sum(op.startswith(prefix) and "128" in op for op in ops) for ops in (ops16, opsb)
                for prefix in ("LDG", "STG")]
        assert wide[:2] == wide[2:], f"{bf16}: LDG/STG.128 counts {wide[2:]} differ from fp16's {wide[:2]}"
        assert len(opsb) <= len(ops16) * 1.05, f"{bf16}: {len(opsb)} instructions, fp16 twin {len(ops16)}"
