#!/usr/bin/env bash
# First GPU probe: doctor, device gate suite, plugin tests, toolchain facts. Logs under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/ditgate-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
source benchmarks/gpu/setup_env.sh "$OUT/pip.log"
P=""; python3 -c "import importlib.metadata as m, sys; sys.exit(0 if any(e.name=='ditgate' for e in m.entry_points(group='pytest11')) else 1)" || P="-p pytest_ditgate.plugin"
echo "plugin load: ${P:-entry point}"
python3 -m pytest_ditgate doctor --json > "$OUT/doctor.json" 2> "$OUT/doctor.err"; echo "doctor rc=$?"
python3 -m pytest_ditgate doctor | head -12
python3 -m pytest $P --ditgate tests/gates/test_device_gate.py -v -rs 2>&1 | tee "$OUT/gate.log" | tail -8
DITGATE_DEVICE_PROFILE=a5500 python3 -m pytest $P --ditgate tests/gates/test_device_gate.py -rs 2>&1 | tail -4
python3 -m pytest $P --ditgate --ditgate-target=h200 tests/gates/test_device_gate.py -q 2>&1 | tail -2
python3 -m pytest $P --ditgate --ditgate-target=a5500 tests/gates/test_device_gate.py -q 2>&1 | tail -3
python3 -m pytest $P tests/plugin -q -x 2>&1 | tail -5 | tee "$OUT/plugin_tests.log"
{ nvcc --version | tail -2; nvcc --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | grep -E "TOP=|INCLUDES=|LIBRARIES=" ; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"; python3 -c "
import torch
from torch.profiler import profile, ProfilerActivity
x=torch.randn(1<<20,device='cuda')
with profile(activities=[ProfilerActivity.CUDA]) as p:
    for _ in range(3): x+1
    torch.cuda.synchronize()
ev=[e for e in p.events() if e.device_type==torch.autograd.DeviceType.CUDA]
print('cupti kernel events', len(ev), ev[0].name if ev else None)
"; } 2>&1 | tee "$OUT/toolchain.txt"
echo "=== summary ==="
python3 - <<'PY'
import json, os
d = json.load(open(os.path.join(os.environ.get("OUT", "/tmp/ditgate-out"), "doctor.json")))
dev = d["device"]
print(f"ok={d['ok']} name={dev['name']} arch={dev['arch']} sms={dev['sm_count']} L2={dev['l2_bytes']} mem={dev['total_memory_bytes']} driver={dev['driver']} sdpa={dev['sdpa']} nvml={dev['nvml']}")
PY
