#!/bin/bash
# Issue 28 run-2 (session 15, H200, carry .third_party): run-1 found the row-paired layout 9-15% faster at 64
# tokens and 5-32% slower at one token with the default layout's tiles. Sweep the decode tiles for both layouts
# at 1, 8 and 64 tokens (rows x warps 64 x 4, 128 x 4, 128 x 8, 256 x 8 (8 warps: two warpgroups on one
# activation tile, triton_kernels' Hopper choice; counted on the CPU: the 4-warp loop per warp), split_k 1 / 2 / 4,
# 3 / 4 stages; mma_steps 2 and maxnreg 96 left out: slower at every point of the earlier sweeps), MXFP4 on
# gpt-oss-120b and Kimi-K2 (~4 min a layout: LIMIT=200 each, two calls if need be: ONLY=0 or ONLY=1); then
# NVFP4 W4A16 and W4A4 at one token in the default layout (run-3: 1.16x / 1.27x MXFP4 there, the gap in the GEMMs
# at 0.7 waves; tile_config takes the weight kind, so NVFP4 may get its own one-token row).
export PYTHONUNBUFFERED=1
for rp in ${ONLY:-0 1}; do
  t0=$(date +%s); mkdir -p $OUT/row-pairs-$rp
  MOE_CONFORMANCE_BITPLACE_ROW_PAIRS=$rp OUT=$OUT/row-pairs-$rp timeout ${LIMIT:-200} python3 tools/tune_moe.py \
    --case gpt-oss-120b/w_mxfp4/triton_bitplace --case kimi-k2/w_mxfp4/triton_bitplace --tokens 1 8 64 \
    --where mma_steps=1 --where maxnreg=0 > $OUT/tune-row-pairs-$rp.log 2>&1
  echo "row_pairs=$rp: rc=$? $(( $(date +%s) - t0 )) s"
  grep -E "best|copy bandwidth" $OUT/tune-row-pairs-$rp.log
done
t0=$(date +%s); mkdir -p $OUT/nvfp4-t1
OUT=$OUT/nvfp4-t1 timeout ${LIMIT:-200} python3 tools/tune_moe.py --case gpt-oss-120b/w_nvfp4/triton_bitplace \
  --case gpt-oss-120b/w_nvfp4_a_nvfp4/triton_bitplace --tokens 1 --where mma_steps=1 --where maxnreg=0 \
  > $OUT/tune-nvfp4-t1.log 2>&1
echo "nvfp4 T1: rc=$? $(( $(date +%s) - t0 )) s"
grep -E "best" $OUT/tune-nvfp4-t1.log
