#!/usr/bin/env bash
# Bring quack-kernels and NVIDIA's CuTe DSL (nvidia-cutlass-dsl) to the offline GPU machine for the fast DiT's
# gemm=quack and gemm=quack_fc1 (their GPU tests and gates, and dit_bench's cases; the GPU check runs them when
# quack is staged). The DSL's library wheel (about 92 MB) is larger than what one device call may carry beside
# the tree (64 MiB in all), so it travels in three parts, one per call, and the last call puts it together and
# installs everything under /tmp/quack/site-packages.
#
#   here, once:          benchmarks/gpu/stage_quack.sh download        (needs PyPI; writes .stage/, ignored)
#   device call 1, 2:    carry [".stage/partK"], command: benchmarks/gpu/stage_quack.sh keep K
#   device call 3:       carry [".stage/part3", ".whl"], command: benchmarks/gpu/stage_quack.sh keep 3 &&
#                        benchmarks/gpu/stage_quack.sh install
#                        (then PYTHONPATH=$Q:$Q/nvidia_cutlass_dsl/dsl_packages python3 ..., Q=/tmp/quack/site-packages)
#   later calls on the same warm machine (a GPU check with quack): carry [".whl"] and start with
#                        source benchmarks/gpu/setup_env.sh (it puts quack on PYTHONPATH when it is installed)
#
# The calls must follow each other while the machine is warm (30 s): /tmp/quack-stage lives on that machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
QUACK=quack-kernels==0.6.5
DSL=4.8.1
KEEP=/tmp/quack-stage
# a folder named site-packages: quack fingerprints a fused epilogue's code down to, not into, installed
# packages, and tells them by that name; under another name it walks into the DSL and fails
SITE=/tmp/quack/site-packages

case "${1:-}" in
download)
    rm -rf .stage && mkdir -p .stage/wheels .stage/part1 .stage/part2 .stage/part3
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
        -d .stage/wheels "$QUACK" "nvidia-cutlass-dsl==$DSL" "nvidia-cutlass-dsl-libs-base==$DSL" \
        "nvidia-cutlass-dsl-libs-cu13==$DSL" "nvidia-cutlass-dsl-libs-core==$DSL" "apache-tvm-ffi<0.2,>=0.1.6" \
        torch-c-dlpack-ext einops protobuf nvidia-matmul-heuristics "cuda-bindings>=13,<14"
    big=$(ls .stage/wheels/nvidia_cutlass_dsl_libs_cu13-*.whl)
    (cd .stage/wheels && sha256sum *.whl) > .stage/part1/SHA256SUMS
    mv .stage/wheels/nvidia_matmul_heuristics-*.whl .stage/wheels/nvidia_cutlass_dsl_libs_core-*.whl \
        .stage/wheels/protobuf-*.whl .stage/part2/
    mv .stage/wheels/cuda_bindings-*.whl .stage/part3/
    find .stage/wheels -name '*.whl' ! -name "$(basename "$big")" -exec mv {} .stage/part1/ \;
    basename "$big" > .stage/part1/BIG
    # the big wheel in three pieces that even out the parts, counting .whl/ (diffusers and the quality
    # models' packages, about 9 MB) with part 3: the third call carries both
    size() { du -cb "$@" | tail -1 | cut -f1; }
    whl=$(du -sb .whl 2>/dev/null | cut -f1 || true); whl=${whl:-9000000}  # .whl/ not fetched yet: its usual size
    each=$(( ($(size .stage/part1 .stage/part2 .stage/part3 "$big") + whl) / 3 ))
    first=$(( each - $(size .stage/part1) )) second=$(( each - $(size .stage/part2) ))
    piece() { dd if="$big" of="$1" bs=1M iflag=skip_bytes,count_bytes skip="$2" ${3:+count="$3"} status=none; }
    piece .stage/part1/big.0 0 "$first"
    piece .stage/part2/big.1 "$first" "$second"
    piece .stage/part3/big.2 $((first + second))
    rm -rf .stage/wheels
    du -sh .stage/part* $(ls -d .whl 2>/dev/null)
    ;;
keep)
    part=".stage/part${2:?which part}"
    mkdir -p "$KEEP" && cp "$part"/* "$KEEP"/
    ls "$KEEP"
    ;;
install)
    cd "$KEEP"
    cat big.0 big.1 big.2 > "$(cat BIG)"
    sha256sum -c --quiet SHA256SUMS
    # the machine's own cuda-bindings (torch's) wins; the staged one only fills a gap
    if python3 -c "import cuda.bindings" 2>/dev/null; then rm -f cuda_bindings-*.whl; fi
    # one pip call: three of the wheels share the nvidia_cutlass_dsl/ folder, which --target would replace
    rm -rf "$SITE"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" ./*.whl
    # --target does not run the DSL's .pth file, which puts its packages on sys.path
    echo "installed; use PYTHONPATH=$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages"
    ;;
*)
    echo "usage: $0 download | keep K | install" >&2
    exit 2
    ;;
esac
