# Sourced at the start of a device call (`source benchmarks/gpu/setup_env.sh [LOG]`): installs the .whl/
# wheels (diffusers and the quality models' packages, which the GPU image lacks) into /tmp/site, puts them
# and, when stage_quack.sh installed it on this machine, quack and NVIDIA's CuTe DSL on PYTHONPATH, and
# installs the project editable. One copy of the install line for every device script and GPU check call.
# LOG (default /dev/null) gets pip's output; a failed editable install falls back to src/ on the path.
_setup_log=${1:-/dev/null}
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl > "$_setup_log" 2>&1 || echo "setup_env: installing .whl/ failed (see $_setup_log)"
fi
_quack=/tmp/quack/site-packages
export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
if [ -d "$_quack" ]; then
    export PYTHONPATH="$PYTHONPATH:$_quack:$_quack/nvidia_cutlass_dsl/dsl_packages"
fi
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >> "$_setup_log" 2>&1 \
    || { echo "setup_env: editable install failed, using src/ on PYTHONPATH"; export PYTHONPATH="$PWD/src:$PWD:$PYTHONPATH"; }
unset _setup_log _quack
