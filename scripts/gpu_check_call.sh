#!/usr/bin/env bash
# One device call of the GPU check: set up the GPU machine (benchmarks/gpu/setup_env.sh: the .whl/ wheels
# of benchmarks/gpu/fetch_wheels.sh, quack when stage_quack.sh installed it, the project editable), run
# scripts/gpu_check.py with the arguments given (e.g. --changed --budget-s 500), and leave under $OUT what
# must come back: the merged record (gpu_check.json: copy it to benchmarks/results/ before the next call or
# the commit), the benchmark results, the logs and the recordings packed in one archive (a call returns at
# most 8 files). A later call on the same warm machine starts from the record this one left there. Prints
# the check's table last. GPU_CHECK_CALL_S (default 540) stops the check before the
# call's 10 minutes are up.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?gpu_check_call.sh runs on the device machine, where OUT names the folder that comes back}
mkdir -p "$OUT/logs" "$OUT/results"
setup_started=$SECONDS
source benchmarks/gpu/setup_env.sh "$OUT/logs/pip.log"
# the set-up's own time (gpu_check.py's CALL_SETUP_S estimates it for --plan)
echo "gpu_check_call: set-up took $((SECONDS - setup_started)) s" | tee "$OUT/logs/setup_s.log"
# the record: the one an earlier call on this machine left (a warm machine keeps /tmp between calls), else
# the committed one
STATE=/tmp/gpu_check_state.json
RECORD=benchmarks/results/gpu_check.json
[ -f "$STATE" ] && RECORD=$STATE
# stopped (SIGINT, its stages' process groups killed) before the call's own limit, so that what ran comes back
# (--call-s: the check stops a stage itself before then, keeping the test files that finished)
CALL_S=${GPU_CHECK_CALL_S:-540}
timeout --signal=INT --kill-after=20 "$CALL_S" \
    python3 scripts/gpu_check.py --record "$RECORD" --json "$OUT/gpu_check.json" --logs "$OUT/logs" \
    --out "$OUT/results" --call-s "$CALL_S" "$@" > "$OUT/logs/gpu_check.log" 2>&1
status=$?
[ -f "$OUT/gpu_check.json" ] && cp "$OUT/gpu_check.json" "$STATE"
bash scripts/scrub_paths.sh "$OUT/logs" "$OUT/results"  # what comes back is committed: no machine paths
tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs results && rm -rf "$OUT/logs" "$OUT/results"
tail -n 40 < <(tar -xzOf "$OUT/logs.tar.gz" logs/gpu_check.log)
exit $status
