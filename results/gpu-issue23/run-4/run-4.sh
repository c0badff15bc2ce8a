#!/bin/bash
# Issue 23 run-4 (carry .third_party): where triton_kernels_ogs's non-GEMM time goes; the rest of the model shapes.
export PYTHONUNBUFFERED=1
for t in 1 8; do for s in w_mxfp4 bf16; do
  python3 tools/ncu_moe.py --model gpt-oss-120b --scheme $s --backend triton_kernels_ogs --tokens $t --kernels
done; done 2>&1 | tee $OUT/kernels.log
python3 tools/ncu_moe.py --model gpt-oss-120b --scheme w_mxfp4 --backend triton_bitplace --tokens 1 --kernels 2>&1 | tee -a $OUT/kernels.log
timeout 200 python3 -m harness model-shapes --backend triton_kernels_ogs --model gpt-oss-120b --tp 2 \
  --tokens 1 8 64 2>&1 | tee $OUT/model-shapes-tp2.log | tail -20
timeout 60 python3 -m harness model-shapes --backend triton_kernels_ogs --model gpt-oss-120b --tp 1 \
  --tokens 64 --scheme w_mxfp4 2>&1 | tee $OUT/model-shapes-tp1-T64.log | tail -5
