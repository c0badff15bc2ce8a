#!/bin/bash
# Issue 24 run-1 on the H200 (carry .third_party): the shape classes on the compiled GPU backends, every scheme.
export PYTHONUNBUFFERED=1
timeout 300 python3 -m pytest -p no:cacheprovider -m sm90 suites/test_conformance.py -k test_shape_class -n 8 \
  --hypothesis-profile=dev --report=$OUT/shapes -rfEx --tb=short 2>&1 | tee $OUT/shapes.log | tail -60
