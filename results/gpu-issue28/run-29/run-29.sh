#!/bin/bash
# Issue 28 run-29 (session 29; H200, carry .third_party). PART may name several parts.
#   PART=bfb     ~4 min: NVFP4 W4A16's new prefill row (128 rows, 128 weight rows on 8 warps, 3 stages; run-28
#                PART=stages) bit for bit against the 64-row 4-warp row at 100 and 600 tokens (8 experts: 50-600 rows
#                an expert, tail blocks of 32 and 64); W4A4's 64-row row with 32-row tails against none, and W4A4 on the
#                8-warp row, its quantization in GEMM1's epilogue or its own launch (quant_launch; PART=w4a4 times them)
#   PART=memcheck ~3 min: compute-sanitizer memcheck over tools/sanitize_kernels.py (now with the 8-warp row)
#   PART=w4a4    ~7 min: NVFP4 W4A4, where 128 rows lost (run-27/28) though its K loop is W4A16's within 1% (count_loop_
#                instructions) and its GEMM1 compiles to twice W4A16's SASS (the epilogue's NVFP4 quantization), 2
#                stages (2 programs an SM) beat 3 at 128 rows: 64 / 128 rows, 4 / 8 warps, tails, the quantization
#                in GEMM1's epilogue or its own launch (quant_launch), both models
#   PART=timeline ~3 min: gpt-oss-120b's 8192-token kernels on a time line at W4A4's 64- and 128-row tiles and
#                W4A16's (chain_timeline --config); the decode forward kernel by kernel (chain_timeline, the bench's tiles), MXFP4 gluon,
#                gpt-oss-120b at 8 and 64 tokens (57.7 / 69.6% of copy in run-26) beside Kimi-K2 at 8 (73.4%)
#   PART=bench   ~4 min: make bench's 8192-token rows under the judged-lower rule (run-24's PART=bench), at this tree
#   PART=check   ~2 min (session 30): _round_to_format (the NVFP4 epilogue's values without the code round trip) compiled,
#                every bf16 against the reference; quant_launch's bits; conformance and special values of triton_bitplace
#                on NVFP4 (the epilogue quantizes W4A4's GEMM2 input, the 8-warp W4A16 row)
export PYTHONUNBUFFERED=1
HOST=$(python3 -m harness platforms --host)
for part in ${PART:-bfb}; do
case $part in
  bfb)
    # scheme | the reference's tiles | the row's tiles and what is swept (both 64-row 4-warp refs at 3 stages, group_m 8)
    R="--ref-config num_stages=3 --ref-config group_m=8 --ref-config block_m=64"
    C="--config num_stages=3 --config group_m=8"
    while IFS='|' read scheme ref row; do
      for m in gpt-oss-120b kimi-k2; do
        timeout 110 python3 tools/bit_for_bit.py --model $m --scheme $scheme --tokens 100 600 --ref triton_bitplace \
          $R $ref --backend triton_bitplace $C $row
        echo "$m $scheme: rc=$?"
      done
    done 2>&1 <<'ROWS' | grep -v -i warn | tee $OUT/bfb.log
w_nvfp4|--ref-config tail_m=32|--config block_m=128 --config block_n=128 --config num_warps=8 --sweep tail_m=32,64
w_nvfp4_a_nvfp4||--config block_m=64 --sweep tail_m=32
w_nvfp4_a_nvfp4||--config block_m=128 --config block_n=128 --config num_warps=8 --sweep tail_m=32,64 --sweep quant_launch=0,1
ROWS
    ;;
  check)
    timeout 100 python3 -m pytest -p no:cacheprovider -q suites/test_triton_helpers.py \
      -k "round_to_format or quant_launch or round_bf16" > $OUT/helpers.log 2>&1
    echo "helpers: rc=$? $(tail -1 $OUT/helpers.log)"; grep -E "^(FAILED|ERROR)|Error" $OUT/helpers.log | head -5
    timeout 170 python3 -m pytest -p no:cacheprovider -q -n 8 -m $HOST suites/test_conformance.py \
      suites/test_special_values.py -k "triton_bitplace and nvfp4" > $OUT/conformance.log 2>&1
    echo "conformance: rc=$? $(tail -1 $OUT/conformance.log)"; grep -E "^(FAILED|ERROR)" $OUT/conformance.log | head -5 ;;
  memcheck)
    timeout 200 compute-sanitizer --tool memcheck python3 tools/sanitize_kernels.py > $OUT/memcheck.log 2>&1
    echo "memcheck: rc=$? $(grep -E 'ERROR SUMMARY' $OUT/memcheck.log | tail -1)" ;;
  w4a4)
    # 64 or 128 rows, 4 warps on 64 weight rows or 8 on 128, 3 stages, tails of 32 / 64, both models; GEMM2's NVFP4
    # input quantized in GEMM1's epilogue (quant_launch 0, the default) or in its own launch (1)
    C="--case gpt-oss-120b/w_nvfp4_a_nvfp4/triton_bitplace --case kimi-k2/w_nvfp4_a_nvfp4/triton_bitplace"
    F="--where group_m=8 --where tma=0 --where persistent=0 --where mma_steps=1 --where num_stages=3
       --where inline_tails=0 --where block_m=64,128 --where tail_m=32,64"
    for q in 0 1; do
      mkdir -p $OUT/q$q; OUT=$OUT/q$q timeout 200 python3 tools/tune_moe.py --tokens 8192 $C $F --set quant_launch=$q \
        2>&1 | grep -v -i warn > $OUT/w4a4-q$q.log
      echo "quant_launch $q: rc=${PIPESTATUS[0]}"; grep -E "T=8192|Error" $OUT/w4a4-q$q.log | cut -c1-250
    done
    ;;
  timeline)
    # where W4A4's time goes at 128 rows (run-27: 6884 us against W4A16's 5046 at the same tiles): kernel by kernel
    T="--config block_k=128 --config group_m=8 --config num_stages=3 --config tail_m=32"
    for s_t in w_nvfp4_a_nvfp4:64:64:4:0 w_nvfp4_a_nvfp4:128:64:4:0 w_nvfp4:128:64:4:0 w_nvfp4_a_nvfp4:128:64:4:1; do
      IFS=: read s m n w q <<< "$s_t"
      timeout 60 python3 tools/chain_timeline.py --model gpt-oss-120b --tokens 8192 --backend triton_bitplace \
        --scheme $s --replays 5 $T --config block_m=$m --config block_n=$n --config num_warps=$w \
        --config quant_launch=$q 2>&1 | grep -v -i warn
    done > $OUT/w4a4-timeline.log; grep -E "median|moe_gemm" $OUT/w4a4-timeline.log | cut -c1-160
    for mt in gpt-oss-120b:8 gpt-oss-120b:64 kimi-k2:8; do
      timeout 60 python3 tools/chain_timeline.py --model ${mt%:*} --tokens ${mt#*:} --backend triton_bitplace_gluon \
        --scheme w_mxfp4 --replays 20 2>&1 | grep -v -i warn
    done > $OUT/decode-timeline.log; grep -E "median" $OUT/decode-timeline.log ;;
  bench)
    PART=bench bash results/gpu-issue28/run-24/run-24.sh ;;
esac
done
