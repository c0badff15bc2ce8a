#!/bin/bash
# Session 15, H200 (carry .third_party): the two failures of run-8, fixed on the CPU, re-run alone:
# Kimi-K2 bf16 at TP 1 (jax_ragged_dot now declares XLA's autotuning scratch, device_bytes; one token fits again:
# the reference decides eager/one-at-a-time for w13 and w2 together) and the model-shapes CLI with a host-CPU
# backend on a GPU host (the checkpoint is handed to it on the host).
export PYTHONUNBUFFERED=1
timeout ${LIMIT9:-500} python3 -m pytest -p no:cacheprovider -q -rA --junitxml=$OUT/junit.xml \
  "suites/test_model_shapes.py::test_model_shape[kimi-k2/bf16]" \
  suites/test_vllm_fused_moe.py::test_model_shapes_skip_a_share_the_block_does_not_divide \
  -s > $OUT/run-9.log 2>&1
echo "pytest rc=$?"
python3 tools/model_shape_table.py $OUT/junit.xml > $OUT/model-shapes.md
grep -E "^(passed|FAILED|skipped) " $OUT/run-9.log | grep -v "skipped  .*\(tl.dot\|torch\|sm90\|AITER\|quantized\|bit-pl\|triton_kernel\)" | sort -u
tail -5 $OUT/run-9.log
