#!/bin/bash
# Issue 24 run-2 (carry .third_party): triton_kernels_ogs's shape classes after it declines MXFP4 at H <= 128.
export PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -p no:cacheprovider -m sm90 suites/test_conformance.py -k "test_shape_class and triton_kernels_ogs" \
  -n 8 --hypothesis-profile=dev --report=$OUT/ogs -rfEx --tb=short 2>&1 | tee $OUT/ogs-shapes.log | tail -15
