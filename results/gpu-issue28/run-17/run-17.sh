#!/bin/bash
# Issue 28 run-17 (session 22; H200, carry .third_party), each part one call:
#   PART=check bash results/gpu-issue28/run-17/run-17.sh   (~3 min)
#   PART=bench bash results/gpu-issue28/run-17/run-17.sh   (~6 min)
# run-16 found why bf16 prefill by TMA differed from tma 0: _k_loop's ungated path (GEMM2) added each K step's product
# into a second accumulator too, so that compiled, every MMA started from zero and was added in fp32, where the TMA loop
# chained them. Now both chain (one use of the product). check: bf16 bit for bit, tma 1 against tma 0, at 2048 tokens
# (gpt-oss-120b interleaved, Kimi-K2 halves), then conformance and special values of the dequantizing and bit-placement
# paths (bf16, W4A16, NVFP4 W4A4; the changed ungated loop) on the GPU.
# bench: every issue-28 target from one make bench run with the new prefill rows (bf16: tma 1, 3 stages; FP4: 128-row
# blocks with 64-row tails, tma 1 for NVFP4). The filter of run-13 / run-14.
export PYTHONUNBUFFERED=1
HOST=$(python3 -m harness platforms --host)
BF16="block_m=128 block_n=128 block_k=64 num_warps=8 num_stages=3 group_m=8"
cfg() { for kv in $2; do echo -n " --$1 $kv"; done; }
case "${PART:-check}" in
check)
  for case in "gpt-oss-120b" "kimi-k2"; do
    timeout 90 python3 tools/bit_for_bit.py --model $case --scheme bf16 --tokens 2048 --ref triton_emulation \
      $(cfg ref-config "$BF16") --backend triton_emulation $(cfg config "$BF16") --sweep tma=1 --replays 2 \
      >> $OUT/bfb.log 2>&1
    echo "bf16 $case tma 1: rc=$? (the number of points that differ)"
  done
  cat $OUT/bfb.log
  timeout 300 python3 -m pytest -p no:cacheprovider -q -n 8 -m $HOST suites/test_conformance.py \
    suites/test_special_values.py -k "(triton_emulation or triton_bitplace) and (bf16/ or w_mxfp4/ or w_nvfp4/ or \
w_nvfp4_a_nvfp4/ or hypothesis)" > $OUT/conformance.log 2>&1
  echo "conformance: rc=$? $(tail -1 $OUT/conformance.log)"
  grep -E "^(FAILED|ERROR)" $OUT/conformance.log | head -5
  ;;
bench)  # run-14's bench script (the run-13 filter); the call ran these lines inline, with a 450 s timeout
  bash results/gpu-issue28/run-14/bench.sh
  ;;
esac
