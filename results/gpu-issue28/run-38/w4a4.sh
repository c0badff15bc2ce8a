#!/bin/bash
# Issue 28 run-38 (session 42): NVFP4 W4A4 prefill with the values-only NVFP4 activation launch (32 x 128 programs,
# _nvfp4_values) in place of the 16 x 16 codes-and-values one (an H100 or H200; carry .third_party).
#   PART=check  ~2 min: the launch bit for bit with the quantizer's (compiled), the wide top-k sum, quant_launch, the routing fold, the
#               prefill rows against the reference past the fused routing (W4A4), triton_bitplace W4A4 conformance
#   PART=time   ~3 min: replay wall time at 8192 tokens, the table's row (GEMM2's input quantized in GEMM1's epilogue)
#               against quant_launch 1 (both activations by the values-only launch), gpt-oss-120b and Kimi-K2
export PYTHONUNBUFFERED=1
mkdir -p $OUT/w4a4
ROW="block_m=128 block_n=128 block_k=128 num_warps=8 num_stages=3 group_m=8 fit_tail_m=1"  # BITPLACE_TILES' NVFP4 row
cfg() { for kv in "$@"; do printf -- "--config %s " "$kv"; done; }
for part in ${PART:-check time}; do
case $part in
  check)
    timeout 240 python3 -m pytest -p no:cacheprovider -q suites/test_triton_helpers.py suites/test_fp4_bits.py \
      -k "values_only_nvfp4 or top_k_sum_gives or quant_launch or routing_launch_quantizes or activation_quantizers_read or past_the_fused" \
      > $OUT/w4a4/check.log 2>&1
    echo "helpers + prefill rows: rc=$? $(tail -1 $OUT/w4a4/check.log)"; grep -E "^(FAILED|ERROR)" $OUT/w4a4/check.log | head -5
    timeout 200 python3 -m pytest -p no:cacheprovider -q -n 8 -m sm90 suites/test_conformance.py suites/test_special_values.py \
      -k "w_nvfp4_a_nvfp4 and triton_bitplace" > $OUT/w4a4/conformance.log 2>&1
    echo "conformance + special values: rc=$? $(tail -1 $OUT/w4a4/conformance.log)"
    grep -E "^(FAILED|ERROR)" $OUT/w4a4/conformance.log | head -5 ;;
  time)
    for model in gpt-oss-120b kimi-k2; do
      for q in "" "$(cfg $ROW quant_launch=1)"; do
        timeout 200 python3 tools/chain_timeline.py --model $model --scheme w_nvfp4_a_nvfp4 --tokens 8192 \
          --backend triton_bitplace --replays 5 $q > $OUT/w4a4/t.log 2>&1
        echo "$model [${q:-the table row}]: rc=$? $(grep -o 'median replay [0-9.]* us wall' $OUT/w4a4/t.log)"
        grep -E "nvfp4_quantize_kernel|moe_gemm_kernel|topk_reduce" $OUT/w4a4/t.log | head -8
        cat $OUT/w4a4/t.log >> $OUT/w4a4/time-$model.log
      done
    done ;;
esac
done
