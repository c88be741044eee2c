#!/usr/bin/env bash
# Land issue 17's shapes work on main: wip/land_shapes.patch (text) and the binary files kept in
# wip/shapes_capped/, then check that the hashed tree is the one the H200 shapes gates passed on.
# Afterwards: commit, run the GPU check (wip/README.md), commit its record.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
git apply --index wip/land_shapes.patch
kept=wip/shapes_capped
cp "$kept/weights/classifier.safetensors" fixtures/shapes/
cp "$kept/weights/transformer/diffusion_pytorch_model.safetensors" fixtures/shapes/transformer/
cp "$kept/golden/cpu/shapes-ddim-20.safetensors" golden/cpu/
cp "$kept/golden/sm_90/shapes-ddim-50.safetensors" golden/sm_90/
cp "$kept/shapes_preview.png" docs/
git add fixtures/shapes golden docs/shapes_preview.png
git rm -q -r wip/land_shapes.patch wip/land_shapes.sh "$kept" wip/shapes_noise_probe.py wip/shapes_finetune_probe.py \
    wip/shapes_retrain_3min_attention.txt wip/shapes_retrain_3min_manifest.json
want=2610aef92ee636e10c72ba3042fd8fa0fdff6a0e5e37d8a3c15590c6d584d9a0
got=$(python3 scripts/gpu_check.py --hash)
if [ "$got" != "$want" ]; then
    echo "tree hash $got, expected $want: the landed tree differs from the one tested" >&2
    exit 1
fi
echo "landed; tree hash $got (staged, not committed)"
