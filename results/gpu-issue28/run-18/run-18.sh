#!/bin/bash
# Issue 28 run-18 (session 22; H200, carry .third_party; ~1.5 min): bf16 prefill with the weights alone by TMA (tiles'
# tma 2: no block-gathered copy of the activations; make bench's run-17 showed Kimi-K2's "other kernels" at 1965 us of
# 16683, mostly that copy) against tma 1: bit for bit against tma 0 at 2048 tokens, then timed at 8192.
#   bash results/gpu-issue28/run-18/run-18.sh
export PYTHONUNBUFFERED=1
BF16="block_m=128 block_n=128 block_k=64 num_warps=8 num_stages=3 group_m=8"
cfg() { for kv in $2; do echo -n " --$1 $kv"; done; }
for model in gpt-oss-120b kimi-k2; do
  timeout 60 python3 tools/bit_for_bit.py --model $model --scheme bf16 --tokens 2048 --ref triton_emulation \
    $(cfg ref-config "$BF16") --backend triton_emulation $(cfg config "$BF16") --sweep tma=2 >> $OUT/bfb.log 2>&1
  echo "bf16 $model tma 2: rc=$? (the number of points that differ)"
done
cat $OUT/bfb.log
C="--case gpt-oss-120b/bf16/triton_emulation --case kimi-k2/bf16/triton_emulation"
timeout 120 python3 tools/tune_moe.py --prefill $C --where group_m=8 --where block_m=128 --where block_n=128 \
  --where num_warps=8 --where num_stages=3 --where tma=1,2 --where tail_m=0 > $OUT/tune-bf16.log 2>&1
mv $OUT/tune.json $OUT/tune-bf16.json
grep -hE "^  T=|best|Error" $OUT/tune-bf16.log | sed -E "s/'block_k': [0-9]+, //; s/'group_m': 8, //; s/'num_warps': [0-9], //"
