#!/bin/bash
# Session 13, H200 call 4: (A) triton_emulation's FP8 group quantizer by row width, (B) checkpoints built on the
# GPU equal the CPU's, (C) the real-model-shape suite with at most 3 tests on the GPU at once (MOE_CONFORMANCE_GPU_CASES),
# checkpoints built on the GPU and a 64 GB case budget, timed (-rP: every verdict line with its seconds).
export PYTHONUNBUFFERED=1
t0=$(date +%s)
timeout 60 python3 results/gpu-issue24/run-9/probe_quantizer.py > $OUT/probe_quantizer.log 2>&1
timeout 60 python3 results/gpu-issue24/run-9/probe_checkpoint_device.py > $OUT/probe_checkpoint_device.log 2>&1
cat $OUT/probe_*.log
echo "probes $(( $(date +%s) - t0 )) s"
make conformance PY=python3 SETUP= SUITES="suites/test_model_shapes.py" REPORT=report/model-shapes \
  PYTEST="timeout --foreground -s INT -k 20 390 python3 -m pytest -p no:cacheprovider -rP" > $OUT/model-shapes.log 2>&1
echo "make rc=$? wall $(( $(date +%s) - t0 )) s" | tee -a $OUT/model-shapes.log
grep -E "^(FAILED|ERROR|XPASS)|passed|failed,|slowest|^[0-9.]+s (call|setup)|KeyboardInterrupt" $OUT/model-shapes.log | grep -v "^passed " | tail -30
grep -E "^(FAILED|xfailed) " $OUT/model-shapes.log | head
grep -cE "^passed " $OUT/model-shapes.log
