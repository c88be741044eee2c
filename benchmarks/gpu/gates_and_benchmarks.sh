#!/usr/bin/env bash
# Issues 4, 6 and 7 on one H200: gate suites and benchmarks, logs and results under $OUT, a short table last.
#   STAGES: space-separated subset of "kernels rest benchtests bench fidelity dit ditbench gapprobe captureprobe" (default: kernels bench fidelity)
#   DITGATE_COMMIT: the commit measured (the device copy has no .git)
# At most eight files come back from the device, so the logs travel as one logs.tar.gz.
set -uo pipefail
OUT=${OUT:-/tmp/ditgate-out}; mkdir -p "$OUT/logs"
export PYTHONUNBUFFERED=1
STAGES=${STAGES:-"kernels bench fidelity"}
source benchmarks/gpu/setup_env.sh "$OUT/logs/pip.log"
SUMMARY="$OUT/summary.txt"; : > "$SUMMARY"
stage() {  # stage NAME SECONDS COMMAND...: run with a time limit, log, one summary line with the tail
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$OUT/logs/$name.log" 2>&1
  local rc=$?
  printf '%-10s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - start))" \
    "$(grep -E '(passed|failed|error)' "$OUT/logs/$name.log" | tail -1)" | tee -a "$SUMMARY"
}
for s in $STAGES; do
  case $s in
    kernels) stage kernels 120 python3 -m pytest --ditgate tests/gates/kernels tests/kernels tests/gates/test_bench_gpu.py -q -rs -p no:randomly ;;
    rest) stage rest 120 python3 -m pytest --ditgate tests/gates/test_correctness_gpu.py tests/gates/test_device_gate.py tests/dit_fast -q -rs -p no:randomly ;;
    benchtests) stage bench_tests 150 python3 -m pytest --ditgate tests/gates/test_bench_gpu.py -q -rs -p no:randomly ;;
    bench) stage kernels_bench 110 python3 benchmarks/kernels_bench.py --out "$OUT" ;;
    fidelity) stage fidelity 200 python3 benchmarks/timer_fidelity.py --out "$OUT" ;;
    dit) stage dit 150 python3 -m pytest --ditgate tests/gates/dit -q -rs -p no:randomly --durations=15 ;;
    ditbench) stage dit_bench 400 python3 benchmarks/dit_bench.py --out "$OUT" --sampling ;;
    gapprobe) stage graph_gap_probe 50 python3 benchmarks/gpu/graph_gap_probe.py ;;
    captureprobe) stage graph_capture_probe 60 python3 benchmarks/gpu/graph_capture_probe.py ;;
  esac
done
for name in kernels_bench fidelity dit_bench graph_gap_probe graph_capture_probe; do  # benchmark tables stay beside the archive
  [ -f "$OUT/logs/$name.log" ] && mv "$OUT/logs/$name.log" "$OUT/$name.log"
done
tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$OUT/logs"
for name in kernels_bench fidelity dit_bench graph_gap_probe graph_capture_probe; do
  [ -f "$OUT/$name.log" ] && { echo "--- $name"; tail -30 "$OUT/$name.log"; }
done
echo "=== summary ==="; cat "$SUMMARY"
