#!/bin/bash
# Issue 23/24 run-7 on the H200 (carry .third_party): the vLLM release pair with the tighter bound (probabilistic
# GEMM terms; per-tensor FP8 operands float32, no longer a bf16 allowance): 0.33.0 must pass, 0.13.0's bias bug fail.
export PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest -p no:cacheprovider -m sm90 suites/test_conformance.py suites/test_special_values.py \
  --backend vllm_fused_moe@0.33.0 --backend vllm_fused_moe@0.13.0 -n 16 --hypothesis-profile=ci \
  -k "not hypothesis and not shape_class" --report=$OUT/vllm -rfEx --tb=line 2>&1 | tee $OUT/vllm.log \
  | grep -v "^\[gw\|^[.sxXF]*\s*\[\|Warning\|warner" | tail -40
timeout 120 python3 -m harness model-shapes --backend vllm_fused_moe@0.33.0 --backend vllm_fused_moe@0.13.0 \
  --model gpt-oss-120b --tp 2 --tokens 8 --scheme w_fp8_a_fp8 2>&1 | tee $OUT/model-shapes.log | tail -6
