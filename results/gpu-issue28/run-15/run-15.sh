#!/bin/bash
# Issue 28 run-15 (written in session 21 for the next loan; H200, carry .third_party; ~5 min): prefill by TMA (the
# tiles' tma 1, opt-in, compiled for sm90 in make test, bit for bit under the interpreter, never run on a GPU): the
# activation rows gathered block by block into a copy (gather_block_rows, one index_select) that TMA boxes read, and
# bf16 weights as TMA boxes of [E x N_ROWS, K] (triton_kernels._k_loop_tma: gate and up interleaved in one 256-row box,
# one MMA a step; halves two boxes); the bit-placement loop's activation rows likewise.
#   bash results/gpu-issue28/run-15/run-15.sh
# 1. tma 1 bit for bit against tma 0 at 2048 tokens (8 experts; graph replays), bf16 interleaved (gpt-oss-120b) and
#    halves (Kimi-K2), MXFP4 and NVFP4 W4A4 bit placement;
# 2. tools/tune_moe.py --prefill at group_m 8, tma 0 / 1, the prefill tiles and their neighbours.
# If tma wins: put tma 1 in TILE_TABLE's bf16 prefill row / BITPLACE_TILES' prefill row, then make bench's prefill rows.
export PYTHONUNBUFFERED=1
BF16="block_m=128 block_n=128 block_k=64 num_warps=8 num_stages=4 group_m=8"
FP4="block_m=64 block_n=64 block_k=128 num_warps=4 num_stages=3 group_m=8"
cfg() { for kv in $2; do echo -n " --$1 $kv"; done; }
for case in "bf16 gpt-oss-120b triton_emulation BF16" "bf16 kimi-k2 triton_emulation BF16" \
            "w_mxfp4 gpt-oss-120b triton_bitplace FP4" "w_nvfp4_a_nvfp4 kimi-k2 triton_bitplace FP4"; do
  set -- $case
  timeout 90 python3 tools/bit_for_bit.py --model $2 --scheme $1 --tokens 2048 --ref $3 $(cfg ref-config "${!4}") \
    --backend $3 $(cfg config "${!4}") --sweep tma=1 --replays 2 >> $OUT/bfb.log 2>&1
  echo "$1 $2: rc=$? (the number of points that differ)"
done
t0=$(date +%s)
C="--case gpt-oss-120b/bf16/triton_emulation --case kimi-k2/bf16/triton_emulation"
timeout 150 python3 tools/tune_moe.py --prefill $C --where group_m=8 --where block_m=128 --where block_n=128 \
  --where num_warps=8 --where num_stages=3,4 --where tma=0,1 > $OUT/tune-bf16.log 2>&1; mv $OUT/tune.json $OUT/tune-bf16.json
C="--case gpt-oss-120b/w_mxfp4/triton_bitplace --case kimi-k2/w_mxfp4/triton_bitplace \
   --case kimi-k2/w_nvfp4_a_nvfp4/triton_bitplace"  # NVFP4 lost 128 rows in run-14 (registers?): TMA frees some
timeout 240 python3 tools/tune_moe.py --prefill $C --where group_m=8 --where num_stages=3,4 --where tma=0,1 \
  > $OUT/tune-fp4.log 2>&1; mv $OUT/tune.json $OUT/tune-fp4.json
echo "sweeps: $(( $(date +%s) - t0 )) s"
grep -hE "^  T=|best|Error" $OUT/tune-*.log | sed -E "s/'block_k': [0-9]+, //; s/'group_m': 8, //"
