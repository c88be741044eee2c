#!/usr/bin/env bash
# Download, on a machine with PyPI, the wheels the offline GPU machine (Python 3.12, x86_64) lacks into
# .whl/ at the repository root (ignored by git; a device call carries it and setup_env.sh installs it):
# diffusers (the DiT stages), lpips and open-clip-torch (the quality weights' tests), import-linter and
# grimp (the plugin stage's layer test), and what they need beyond the machine's own packages.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl diffusers==0.42.1 importlib_metadata zipp lpips==0.1.4 open-clip-torch==3.3.0 ftfy wcwidth \
    import-linter==2.17 grimp==3.20 rich==14.2.0 click==8.2.1 "$@"
du -sh .whl
