#!/bin/bash
# Issue 23 run-3 on the H200 (device tool, carry .third_party): triton_kernels_ogs compiled, first run.
export PYTHONUNBUFFERED=1
nvidia-smi -L
timeout 280 python3 -m pytest -p no:cacheprovider -m sm90 suites/test_conformance.py suites/test_special_values.py \
  --backend triton_kernels_ogs -n 8 --hypothesis-profile=ci --report=$OUT/ogs -rfEx --tb=short 2>&1 | tee $OUT/ogs.log | tail -150
timeout 240 python3 -m harness model-shapes --backend triton_kernels_ogs --model gpt-oss-120b --tp 1 --tp 2 \
  --tokens 1 8 64 2>&1 | tee $OUT/model-shapes.log | tail -60
