#!/bin/bash
# Issue 23 run-6 (carry .third_party): the rest of run-5 (which ran out of its 420 s limit in model-shapes).
export PYTHONUNBUFFERED=1
python3 -m harness model-shapes --backend triton_kernels_ogs --model gpt-oss-120b --tp 2 --tokens 8 64 \
  --scheme w_mxfp4 2>&1 | tee $OUT/model-shapes-tp2.log | tail -4
python3 -m pytest -p no:cacheprovider -m sm90 suites/test_conformance.py suites/test_special_values.py \
  --backend triton_kernels_ogs -n 8 --hypothesis-profile=ci --report=$OUT/ogs -rfEx --tb=short 2>&1 | tee $OUT/ogs.log | tail -8
