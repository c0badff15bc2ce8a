#!/bin/bash
# Issue 28 run-6 (written in session 16 for the next loan, H200, carry .third_party; ~6 min): the prefill tiles
# again, now that the dequantizing K loop feeds bf16 activations and bf16 weights straight into the MMA (the bf16
# GEMM1 loop 330 -> 117 SASS at 8192 tokens, no shared-memory store and reload before each wgmma; counted on the
# CPU, results/cpu-issue28/README.md) and triton_bitplace stores rows in pairs: tools/tune_moe.py --prefill over
# block_m / block_n 64 or 128, 4 or 8 warps, 3 or 4 stages (triton_emulation) and triton_bitplace's prefill grid, at
# 8192 tokens on gpt-oss-120b and Kimi-K2. The winners go into TILE_TABLE / BITPLACE_TILES.
export PYTHONUNBUFFERED=1
t0=$(date +%s); mkdir -p $OUT/prefill
OUT=$OUT/prefill timeout ${LIMIT:-540} python3 tools/tune_moe.py --prefill --case gpt-oss-120b/bf16/triton_emulation \
  --case kimi-k2/bf16/triton_emulation --case gpt-oss-120b/w_mxfp4/triton_bitplace --case kimi-k2/w_mxfp4/triton_bitplace \
  > $OUT/tune-prefill.log 2>&1
echo "prefill sweep: rc=$? $(( $(date +%s) - t0 )) s"
grep -E "best|copy bandwidth|dense" $OUT/tune-prefill.log
