#!/usr/bin/env bash
# Issue 8 on a two-GPU H200 machine: (1) pytest -n 2 with each worker pinned to its own GPU, (2) one real
# experiment on dit_impl in a scratch git copy: baseline lane, then one optimisation (CUDA graphs) turned on
# and judged. Logs and artefacts under $OUT; a short table last.
#   SELECT: pytest -k expression of the lane tests (default: the DiT-XL/2 candidate tests)
#   CHANGE: sed expression applied to dit_impl/fast/candidate.py for the experiment
set -uo pipefail
OUT=${OUT:-/tmp/ditgate-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
SELECT=${SELECT:-"xl_candidate_forward or xl_candidate_versus or xl-ddim-10"}
CHANGE=${CHANGE:-"s/cuda_graphs=False)/cuda_graphs=True)/"}
XDIST_TESTS=${XDIST_TESTS:-"tests/gates/test_device_gate.py tests/gates/test_correctness_gpu.py"}
source benchmarks/gpu/setup_env.sh "$OUT/pip.log"
DITGATE="python3 -m pytest_ditgate"
nvidia-smi -L 2>/dev/null | tee "$OUT/gpus.txt"
git --version || { echo "no git on this machine"; }

echo "=== 1. pytest -n 2, one worker per GPU ==="
python3 -m pytest --ditgate -n 2 $XDIST_TESTS -q -rs -p no:randomly 2>&1 | tee "$OUT/xdist.log" | tail -15

echo "=== 2. experiment on dit_impl in a scratch git repository ==="
EXP=$(mktemp -d)/exp
mkdir -p "$EXP" && tar --exclude=.whl --exclude=.ditgate --exclude=.git -cf - . | tar -xf - -C "$EXP"
cd "$EXP" || exit 1
export GIT_AUTHOR_NAME=agent GIT_AUTHOR_EMAIL=agent@example.com GIT_COMMITTER_NAME=agent GIT_COMMITTER_EMAIL=agent@example.com
git init -q && git add -A && git commit -qm project && git checkout -qb autoresearch/h200
$DITGATE baseline --lane dit-fwd -- tests/gates/dit/test_candidate_lane.py -k "$SELECT" -p no:randomly 2>&1 | tee "$OUT/baseline.log" | tail -25
git add -A && git commit -qm "freeze the baseline"
sed -i "$CHANGE" dit_impl/fast/candidate.py && git diff --stat
git commit -qam "turn CUDA graphs on for the fast DiT"
python3 -m pytest --ditgate --ditgate-class=numerical --ditgate-lane=dit-fwd \
  --ditgate-description="turn CUDA graphs on for the fast DiT" --ditgate-verdict-json="$OUT/verdict.json" \
  tests/gates/dit/test_candidate_lane.py -k "$SELECT" -p no:randomly 2>&1 | tee "$OUT/experiment.log" | tail -30
echo "experiment exit code: ${PIPESTATUS[0]}"
$DITGATE summary --lane dit-fwd | tee "$OUT/summary.txt"
$DITGATE report --out "$OUT/report.html"
cp .ditgate/results.tsv "$OUT/results.tsv" 2>/dev/null
cp .ditgate/experiments.jsonl "$OUT/experiments.jsonl" 2>/dev/null
echo "=== summary ==="
grep -E "passed|failed" "$OUT/xdist.log" | tail -1
grep -A3 "ditgate GPUs per worker" "$OUT/xdist.log"
grep -E "VERDICT|objective" "$OUT/baseline.log" "$OUT/experiment.log"
