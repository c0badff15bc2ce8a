#!/bin/bash
# Issue 28 run-41 (staged in session 44, not yet run; an H200 or H100, carry .third_party). PART names the parts:
#   PART=bfb, PART=time (~6 min each: a call each): the block factors of session 44 (the defaults; compiled for
#               sm90 by Triton 3.6 on the CPU): read in place by the packed multiply's operand selector
#               (triton_kernels.HALF_SELECT: MXFP4 and NVFP4 in moe_gemm_kernel) and NVFP4's built from codes stored
#               plus 0x78 (triton_bitplace.NVFP4_BIASED_SCALES, the Gluon decode GEMM too): NVFP4 K step 514 -> 482
#               -> 458 SASS at decode (Gluon 418 -> 394), 552 -> 520 -> 496 in the 8-warp prefill row; MXFP4 439 ->
#               423, 511 -> 495.
#               bfb: bit for bit across processes (tools/bit_for_bit.py --save with both off, then --against with the
#               defaults) at the decode tiles, 8 / 64 tokens (moe_gemm_kernel and the Gluon GEMM), and the prefill
#               rows, 300 / 2048 tokens; MXFP4, NVFP4 W4A16 and W4A4; both models.
#               time: replay wall time at 8192 tokens, both off, HALF_SELECT alone, both on (MXFP4: off and on); and
#               NVFP4's 4-warp scale_regs tile (612 -> 556 SASS, two programs a multiprocessor) beside the 8-warp row.
# Conformance, special values and memcheck of the changed kernels: PART=check bash results/gpu-issue28/run-35/run-35.sh.
export PYTHONUNBUFFERED=1
mkdir -p $OUT/halves
# the table's prefill rows (BITPLACE_TILES) as bit_for_bit / chain_timeline flags, tails by the mean rows an expert
row() {  # scheme model
  if [ $1 = w_mxfp4 ]; then
    echo "--config block_m=128 --config block_n=64 --config block_k=128 --config num_warps=4 --config num_stages=3" \
      "--config group_m=8 --config tail_m=64 --config inline_tails=1"
  else
    echo "--config block_m=128 --config block_n=128 --config block_k=128 --config num_warps=8 --config num_stages=3" \
      "--config group_m=8 --config quant_launch=1 --config tail_m=$([ $2 = kimi-k2 ] && echo 64 || echo 32)"
  fi
}
for part in ${PART:-bfb}; do
case $part in
  bfb)
    for model in gpt-oss-120b kimi-k2; do
      for scheme in w_mxfp4 w_nvfp4 w_nvfp4_a_nvfp4; do
        for where in decode gluon prefill; do
          tok="8 64"; cfg=""; be=triton_bitplace
          [ $where = gluon ] && be=triton_bitplace_gluon
          [ $where = prefill ] && tok="300 2048" && cfg="$(row $scheme $model)"
          kept=/tmp/kept-$model-$scheme-$where.pt
          log=$OUT/halves/bfb-$model-$scheme-$where.log
          MOE_CONFORMANCE_HALF_SELECT=0 MOE_CONFORMANCE_NVFP4_BIASED_SCALES=0 timeout 120 python3 \
            tools/bit_for_bit.py --model $model --scheme $scheme --tokens $tok --backend $be $cfg --save $kept 2>&1 \
            | grep -v -i warn > $log
          timeout 120 python3 tools/bit_for_bit.py --model $model --scheme $scheme --tokens $tok \
            --backend $be $cfg --against $kept 2>&1 | grep -v -i warn >> $log
          echo "bfb $model $scheme $where: $(grep -c 'bit for bit True' $log) same, $(grep -c 'bit for bit False' $log) differ"
        done
      done
    done ;;
  time)
    for model in gpt-oss-120b kimi-k2; do
      for scheme in w_mxfp4 w_nvfp4 w_nvfp4_a_nvfp4; do
        for hb in 00 10 11; do
          [ $scheme = w_mxfp4 ] && [ $hb = 10 ] && continue
          log=$OUT/halves/time-$model-$scheme-$hb.log
          MOE_CONFORMANCE_HALF_SELECT=${hb:0:1} MOE_CONFORMANCE_NVFP4_BIASED_SCALES=${hb:1:1} timeout 60 \
            python3 tools/chain_timeline.py --model $model --scheme $scheme --tokens 8192 --backend triton_bitplace \
            --replays 5 $(row $scheme $model) 2>&1 | grep -v -i warn > $log
          echo "$model $scheme HALF_SELECT=${hb:0:1} BIASED_SCALES=${hb:1:1}: $(grep -o 'median replay [0-9.]* us' $log)"
        done
      done
      # NVFP4's 4-warp 128 x 64 tile with scale_regs (112 KB: two programs a multiprocessor, as MXFP4's row runs):
      # 5073.6 -> 4750.1 us on an H100 against the 8-warp row's 4582.7 (run-33); its K loop now 612 -> 556 SASS
      for scheme in w_nvfp4 w_nvfp4_a_nvfp4; do
        log=$OUT/halves/time-$model-$scheme-4warp.log
        timeout 60 python3 tools/chain_timeline.py --model $model --scheme $scheme --tokens 8192 \
          --backend triton_bitplace --replays 5 $(row $scheme $model | sed 's/block_n=128/block_n=64/;
          s/num_warps=8/num_warps=4/') --config scale_regs=1 2>&1 | grep -v -i warn > $log
        echo "$model $scheme 4 warps, scale_regs: $(grep -o 'median replay [0-9.]* us' $log)"
      done
    done ;;
esac
done
parts=${PART:-bfb}
(cd $OUT && tar czf run-41-${parts// /-}.tgz halves && rm -rf halves)
