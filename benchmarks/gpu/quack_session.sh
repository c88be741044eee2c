#!/usr/bin/env bash
# The device call after quack is staged (stage_quack.sh keep 3 && install, same warm machine): installs the
# .whl wheels (diffusers for the float32 reference) into /tmp/site, then runs, with quack on PYTHONPATH,
#   1. with QUACK_TESTS=1, the gemm=quack GPU tests and golden gate (strict: they must pass, not skip; the
#      GPU check's suites stage runs them too when quack is staged),
#   2. dit_bench: the fastest seamed forward with and without gemm=quack beside diffusers compile + graph,
#      with a phase profile of each (the issue's committed profile of the final forward),
#   3. with SAMPLING=1 (the default), issue 18's sampling target with the fastest set (seamed + quack): 50
#      steps of 8 images with CFG and the VAE decode against the diffusers pipeline, 7 alternating pairs,
#   4. with SEAM=1 (off by default: autotuning compiles many configurations, give it a call of its own),
#      quack_seam_probe.py: the gated residual in a quack epilogue of attention-out
#      and fc2 against cuBLAS + the seam kernel, default and autotuned configurations,
#   5. the judge's dispatch observer's per-op cost on the GPU host.
# FORWARD_CONFIGS (";"-separated) and SAMPLING_CONFIG replace the forward cases and the sampling set.
# Full logs and results go to one archive, $OUT/quack_session.tgz (at most 8 files come back from a device
# call: the profiles alone are more); a short table is printed last.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to a folder for the logs}"
FINAL_OUT=$OUT
OUT=$(mktemp -d /tmp/quack_session.XXXX)
trap 'tar czf "$FINAL_OUT/quack_session.tgz" -C "$OUT" .' EXIT
source benchmarks/gpu/setup_env.sh "$OUT/pip.log"
SEAMED="cuda_graphs=1,gelu_epilogue=1,adaln=kernels,sdpa=cudnn,block_seam=1"

tests_rc=skipped
[ "${QUACK_TESTS:-0}" = 1 ] && { python3 -m pytest --ditgate -p no:cacheprovider -rs -q tests/dit_fast/test_fast_gpu.py \
    tests/gates/dit/test_fast_switches.py tests/dit_fast/test_fast_gemms.py -k quack > "$OUT/quack_tests.log" 2>&1; tests_rc=$?; }
timeout 300 python3 benchmarks/dit_bench.py --out "$OUT/forward" --reps 30 --profile \
    --configs "${FORWARD_CONFIGS:-$SEAMED;$SEAMED,gemm=quack}" > "$OUT/dit_bench.log" 2>&1
bench_rc=$?
sampling_rc=skipped
[ "${SAMPLING:-1}" = 1 ] && { timeout 240 python3 benchmarks/dit_bench.py --out "$OUT/sampling" --sampling \
    --sampling-config "${SAMPLING_CONFIG:-$SEAMED,gemm=quack}" --no-diffusers-compile --configs "" > "$OUT/sampling.log" 2>&1
    sampling_rc=$?; }
seam_rc=skipped
[ "${SEAM:-0}" = 1 ] && { timeout 300 python3 benchmarks/gpu/quack_seam_probe.py --tuned --out "$OUT/quack_seam.json" \
    > "$OUT/quack_seam.log" 2>&1; seam_rc=$?; }
timeout 60 python3 benchmarks/observer_overhead.py --device cuda --out "$OUT/observer_overhead_cuda.json" \
    > "$OUT/observer_overhead.log" 2>&1
observer_rc=$?

echo "=== quack tests (rc $tests_rc)"; tail -8 "$OUT/quack_tests.log" 2>/dev/null
echo "=== dit_bench (rc $bench_rc)"; tail -30 "$OUT/dit_bench.log"
echo "=== sampling (rc $sampling_rc)"; tail -6 "$OUT/sampling.log" 2>/dev/null
echo "=== quack seam probe (rc $seam_rc)"; tail -8 "$OUT/quack_seam.log" 2>/dev/null
echo "=== observer overhead (rc $observer_rc)"; tail -5 "$OUT/observer_overhead.log"
