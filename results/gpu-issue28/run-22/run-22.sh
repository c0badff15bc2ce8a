#!/bin/bash
# Issue 28 run-22 (session 24 wrote it; no device time was left to run it): H200, carry .third_party.
#   PART=probe  ~2-3 min: tma128_bisect.py (which dimension makes 128-row TMA activations wrong in the bit-placement loop)
#   PART=prefill ~2.5 min: run-21's MXFP4 prefill rows (fit_tail_m, never timed by make bench)
#   PART=bench  ~6 min: run-14's filter, every issue-28 target from one make bench run at this commit's defaults
#   PART=serial ~5 min: serial_k (split-K tiles finished in the GEMM's launch, one launch fewer at decode) on
#               triton_bitplace: bit for bit against serial_k 0 at 1 / 8 tokens (graph replays), memcheck and racecheck
#               of tools/sanitize_kernels.py (its serial_k case), then tune_moe at the decode row's tiles, serial_k 0 / 1
export PYTHONUNBUFFERED=1
here=$(dirname "$0")
case "${PART:-probe}" in
  probe) timeout 400 python3 "$here/tma128_bisect.py" 2>&1 | grep -v Warning | tee $OUT/tma128_bisect.log ;;
  prefill) bash results/gpu-issue28/run-21/bench-prefill.sh ;;
  bench) bash results/gpu-issue28/run-14/bench.sh ;;
  serial)
    T="block_m=16 block_n=64 block_k=128 num_warps=4 num_stages=3"
    for model in gpt-oss-120b kimi-k2; do
      for scheme in w_mxfp4 w_nvfp4_a_nvfp4; do
        for split in 2 4; do
          timeout 60 python3 tools/bit_for_bit.py --model $model --scheme $scheme --tokens 1 8 --ref triton_bitplace \
            $(for kv in $T split_k=$split; do echo -n " --ref-config $kv"; done) --backend triton_bitplace \
            $(for kv in $T split_k=$split; do echo -n " --config $kv"; done) --sweep serial_k=1 >> $OUT/bfb.log 2>&1
          echo "$model $scheme split $split: rc=$?"
        done
      done
    done
    tail -20 $OUT/bfb.log
    for tool in memcheck racecheck; do
      timeout 150 compute-sanitizer --tool $tool python3 tools/sanitize_kernels.py > $OUT/$tool.log 2>&1
      echo "$tool: rc=$?"; grep -E "serial|ERROR SUMMARY|RACECHECK SUMMARY" $OUT/$tool.log
    done
    timeout 200 python3 tools/tune_moe.py --case gpt-oss-120b/w_mxfp4/triton_bitplace --case kimi-k2/w_mxfp4/triton_bitplace \
      --tokens 1 8 --where block_n=64,128 --where num_warps=4 --where num_stages=3 --where mma_steps=1 --where maxnreg=0 \
      --where split_k=2,4 --where serial_k=0,1 > $OUT/tune-serial.log 2>&1
    echo "tune: rc=$?"; grep -E "T=1 |T=8 " $OUT/tune-serial.log | sed 's/block_m=16, //' ;;
esac
