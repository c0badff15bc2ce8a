#!/bin/bash
# Session 11, H200 call 1 (carry .third_party): (A) issue 23's release pair after the FP8-accumulation declaration
# (0.33.0 must pass, 0.13.0's bias bug fail); (B) the GPU half of issue 25's database round trip; (C) the nightly
# leg's first step (the conformance suites), exactly as the workflow runs it.
export PYTHONUNBUFFERED=1
HOST=$(python3 -m harness platforms --host)
t0=$(date +%s)
timeout 120 python3 -m pytest -p no:cacheprovider -m $HOST suites/test_conformance.py suites/test_special_values.py \
  --backend vllm_fused_moe@0.33.0 --backend vllm_fused_moe@0.13.0 -n 16 --hypothesis-profile=ci \
  -k "not hypothesis and not shape_class" --report=$OUT/vllm -rfEx --tb=line 2>&1 > $OUT/vllm.log
grep -E "^(FAILED|XPASS|ERROR)|passed|failed" $OUT/vllm.log | tail -20
echo "A: $(( $(date +%s) - t0 )) s"; t0=$(date +%s)
rm -rf .hypothesis
timeout 120 python3 -m pytest -p no:cacheprovider -m $HOST suites/test_conformance.py -q -rfE \
  --backend examples.hypothesis_only_bug:make_backend -k test_conformance_hypothesis --hypothesis-profile=nightly \
  2>&1 > $OUT/roundtrip-gpu.log
grep -E "tokens=|passed|failed|Falsifying" $OUT/roundtrip-gpu.log | head -12
tar czf $OUT/roundtrip-db.tgz .hypothesis/examples; ls -la $OUT/roundtrip-db.tgz
rm -rf .hypothesis
echo "B: $(( $(date +%s) - t0 )) s"; t0=$(date +%s)
timeout 390 make conformance PY=python3 SETUP= PROFILE=nightly REPORT=report/conformance \
  SUITES="suites/test_conformance.py suites/test_special_values.py suites/test_parallel_conformance.py" \
  > $OUT/nightly-conformance.log 2>&1
echo "make rc=$?"
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/nightly-conformance.log | tail -30
echo "C: $(( $(date +%s) - t0 )) s"
mkdir -p $OUT/nightly-conformance
cp report/conformance/{summary.md,junit.xml} $OUT/nightly-conformance/ 2>/dev/null
