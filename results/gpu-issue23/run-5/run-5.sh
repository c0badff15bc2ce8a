#!/bin/bash
# Issue 23 run-5 (carry .third_party): MXFP4 intermediate padded to 64 as vLLM does; the K-tail reproducer.
export PYTHONUNBUFFERED=1
python3 tools/repro_ogs_k_tail.py 2>&1 | tee $OUT/repro_ogs_k_tail.log
python3 -m harness model-shapes --backend triton_kernels_ogs --model gpt-oss-120b --tp 1 --tp 2 --tokens 1 8 64 \
  2>&1 | tee $OUT/model-shapes.log | tail -14
python3 -m pytest -p no:cacheprovider -m sm90 suites/test_conformance.py suites/test_special_values.py \
  --backend triton_kernels_ogs -n 8 --hypothesis-profile=ci --report=$OUT/ogs -rfEx --tb=short 2>&1 | tee $OUT/ogs.log | tail -8
