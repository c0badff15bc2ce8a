#!/usr/bin/env bash
# The GPU run of issue 5, in one device call (see BENCHMARKS.md / results/):
#   the conformance and harness suites compiled on this GPU (the reference suites are device-independent
#   and run in CI), then compute-sanitizer memcheck and racecheck on the kernels.
# Usage on the device machine, from the repo root:  OUT=/some/dir bash tools/gpu_conformance.sh
set -u
OUT=${OUT:-results/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a "$OUT/gpu.txt"
python3 -m harness platforms | tail -1 | tee -a "$OUT/gpu.txt"
# one CPU thread per worker: the float64 reference runs on the host CPU, 16 workers x 16 threads thrash
export OMP_NUM_THREADS=1
timeout ${PYTEST_TIMEOUT:-400} python3 -m pytest suites/test_conformance.py -p no:cacheprovider --hypothesis-profile=ci -q \
    -n 16 -rfE --backend triton_emulation \
    --junitxml="$OUT/junit.xml" > "$OUT/pytest.log" 2>&1
echo "pytest exit $?" | tee -a "$OUT/gpu.txt"
tail -5 "$OUT/pytest.log"
for tool in ${SANITIZERS-memcheck racecheck}; do
    timeout 80 compute-sanitizer --tool $tool --error-exitcode 9 python3 tools/sanitize_kernels.py \
        > "$OUT/sanitizer-$tool.log" 2>&1
    echo "compute-sanitizer $tool exit $?" | tee -a "$OUT/gpu.txt"
    tail -3 "$OUT/sanitizer-$tool.log"
done
