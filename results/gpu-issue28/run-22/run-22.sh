#!/bin/bash
# Issue 28 run-22 (session 24 wrote it; no device time was left to run it): H200, carry .third_party.
#   PART=probe  ~2-3 min: tma128_bisect.py (which dimension makes 128-row TMA activations wrong in the bit-placement loop)
#   PART=prefill ~2.5 min: run-21's MXFP4 prefill rows (fit_tail_m, never timed by make bench)
#   PART=bench  ~6 min: run-14's filter, every issue-28 target from one make bench run at this commit's defaults
#   PART=serial-check ~5 min: serial_k (split-K tiles finished in the GEMM's launch: no splitk_epilogue_kernel for
#               GEMM1) on triton_bitplace and the Gluon kernel, bit for bit against serial_k 0 at 1 / 8 tokens,
#               memcheck and synccheck of tools/sanitize_kernels.py (its serial_k cases)
#   PART=serial-bench ~5 min: make bench's decode points, serial_k off then on (MOE_CONFORMANCE_SERIAL_K)
export PYTHONUNBUFFERED=1
here=$(dirname "$0")
case "${PART:-probe}" in
  probe) timeout 400 python3 "$here/tma128_bisect.py" 2>&1 | grep -v Warning | tee $OUT/tma128_bisect.log ;;
  prefill) bash results/gpu-issue28/run-21/bench-prefill.sh ;;
  bench) bash results/gpu-issue28/run-14/bench.sh ;;
  serial-check)
    # bit for bit: serial_k 1 against serial_k 0 at the same split (the split sets the sum's order), 1 and 8 tokens
    for model in gpt-oss-120b kimi-k2; do
      for scheme in w_mxfp4 w_nvfp4_a_nvfp4; do
        # (the Gluon kernel on two warpgroups too: gpt-oss-120b's 2880 rows leave the last program's second tile empty)
        for spec in "triton_bitplace|2 4|3|" "triton_bitplace_gluon|1 2 4|4|pdl=1" "triton_bitplace_gluon|2|4|block_n=128"; do
          IFS='|' read be splits stages more <<< "$spec"
          for split in $splits; do
            T="block_m=16 block_n=64 block_k=128 num_warps=4 num_stages=$stages split_k=$split $more"
            timeout 60 python3 tools/bit_for_bit.py --model $model --scheme $scheme --tokens 1 8 --ref $be \
              $(for kv in $T; do echo -n " --ref-config $kv"; done) --backend $be \
              $(for kv in $T; do echo -n " --config $kv"; done) --sweep serial_k=1 >> $OUT/bfb.log 2>&1
            echo "$model $scheme $be split $split: rc=$?"
          done
        done
      done
    done
    tail -24 $OUT/bfb.log
    for tool in memcheck synccheck; do
      timeout 150 compute-sanitizer --tool $tool python3 tools/sanitize_kernels.py > $OUT/$tool.log 2>&1
      echo "$tool: rc=$?"; grep -E "ERROR SUMMARY" $OUT/$tool.log
    done ;;
  serial-bench)
    # the decode points with the defaults, serial_k off then on (MOE_CONFORMANCE_SERIAL_K: the decode row's switch)
    FILTER='(gpt-oss-120b or kimi-k2) and (T1/ or T8/ or T64/) and (w_mxfp4/ or w_nvfp4/ or w_nvfp4_a_nvfp4/) and triton_bitplace_gluon'
    for on in 0 1; do
      MOE_CONFORMANCE_SERIAL_K=$on timeout 270 make bench PY=python3 SETUP= BENCH_ARGS="-k \"$FILTER\"" \
        > $OUT/bench-serial-$on.log 2>&1
      echo "serial_k $on: rc=$?"; tail -1 $OUT/bench-serial-$on.log
      cp bench/table.md $OUT/table-serial-$on.md 2>/dev/null
    done
    grep -h "triton_bitplace_gluon" $OUT/table-serial-*.md | cut -c1-150 ;;
esac
