#!/bin/bash
# Issue 28 run-14 (session 21; H200, carry .third_party; ~5 min): prefill's tile order. At 8192 tokens moe_gemm_kernel
# ran its tiles row blocks fastest, so that the programs resident together share one N block and every activation row
# is streamed from memory once per N block (Kimi-K2: 16 N blocks in GEMM1, 56 in GEMM2 at 128 columns; 112 in
# triton_bitplace's GEMM2 at 64): ~30 GB (bf16) to ~60 GB (FP4) of traffic against 34 / 9 GB of weights. group_m
# (triton_kernels.grouped_tile_order) runs GROUP_M row blocks at a time, each group's N blocks in turn.
#   bash results/gpu-issue28/run-14/run-14.sh
# 1. group_m 4 / 8 / 16 bit for bit against the plain order at 2048 tokens (8 experts), compiled, both loops;
# 2. tools/tune_moe.py --prefill over group_m 0 / 8 / 16 at the prefill tiles (and 8 at the other row height);
# 3. make bench's prefill rows with the tables' new group_m 8.
export PYTHONUNBUFFERED=1
BF16="block_m=128 block_n=128 block_k=64 num_warps=8 num_stages=3"
FP4="block_m=64 block_n=64 block_k=128 num_warps=4 num_stages=3"
cfg() { for kv in $2; do echo -n " --$1 $kv"; done; }
timeout 90 python3 tools/bit_for_bit.py --model kimi-k2 --scheme bf16 --tokens 2048 --ref triton_emulation \
  $(cfg ref-config "$BF16") --backend triton_emulation $(cfg config "$BF16") --sweep group_m=4,8,16 > $OUT/bfb.log 2>&1
echo "bf16 Kimi-K2: rc=$? (the number of points that differ)"
timeout 90 python3 tools/bit_for_bit.py --model gpt-oss-120b --scheme w_nvfp4 --tokens 2048 --ref triton_bitplace \
  $(cfg ref-config "$FP4") --backend triton_bitplace $(cfg config "$FP4") --sweep group_m=4,8,16 >> $OUT/bfb.log 2>&1
echo "NVFP4 gpt-oss-120b: rc=$? (the number of points that differ)"
t0=$(date +%s)
C="--case gpt-oss-120b/bf16/triton_emulation --case kimi-k2/bf16/triton_emulation"
timeout 150 python3 tools/tune_moe.py --prefill $C --where block_n=128 --where num_warps=8 --where num_stages=3 \
  --where block_m=128 --where group_m=0,8,16 > $OUT/tune-bf16.log 2>&1; mv $OUT/tune.json $OUT/tune-bf16.json
timeout 60 python3 tools/tune_moe.py --prefill $C --where block_n=128 --where num_warps=8 --where num_stages=3 \
  --where block_m=64 --where group_m=8 > $OUT/tune-bf16-m64.log 2>&1; mv $OUT/tune.json $OUT/tune-bf16-m64.json
C="--case gpt-oss-120b/w_mxfp4/triton_bitplace --case kimi-k2/w_mxfp4/triton_bitplace"
timeout 120 python3 tools/tune_moe.py --prefill $C --where num_stages=3 --where block_m=64 --where group_m=0,8,16 \
  > $OUT/tune-fp4.log 2>&1; mv $OUT/tune.json $OUT/tune-fp4.json
timeout 60 python3 tools/tune_moe.py --prefill $C --where num_stages=3 --where block_m=128 --where group_m=8 \
  > $OUT/tune-fp4-m128.log 2>&1; mv $OUT/tune.json $OUT/tune-fp4-m128.json
echo "sweeps: $(( $(date +%s) - t0 )) s"
grep -hE "^  T=|best|Error" $OUT/tune-*.log | sed -E "s/'block_k'.*'num_stages': 3, //"
FILTER='(gpt-oss-120b or kimi-k2) and T8192/ and ((w_mxfp4/ or w_nvfp4/ or w_nvfp4_a_nvfp4/) and triton_bitplace and not triton_bitplace_gluon or bf16/ and triton_emulation)'
timeout 150 make bench PY=python3 SETUP= BENCH_ARGS="-k \"$FILTER\"" > $OUT/bench.log 2>&1
echo "bench: rc=$? $(tail -1 $OUT/bench.log)"
mkdir -p $OUT/bench && cp bench/table.md bench/results.json bench/targets.md $OUT/bench/ 2>/dev/null
grep -E "^\| " bench/table.md
