#!/bin/bash
# Issue 28 run-36 (session 38; H200 or H100, carry .third_party). PART may name several parts; every part's files go
# into one tar under $OUT.
#   triton_bitplace_gluon's prefill blocks (gluon_prefill, MOE_CONFORMANCE_GLUON_PREFILL=1):
#   PART=gbfb      bit for bit against triton_bitplace's moe_gemm_kernel at 64-pair blocks (300 and 2048 tokens,
#                  8 experts at each model's sizes; MXFP4, NVFP4 W4A4, NVFP4)
#   PART=gconf     suites/test_fp4_bits.py's prefill rows against the reference at 1200 pairs (moe_gemm_kernel's
#                  rows and the Gluon row; MXFP4, NVFP4, NVFP4 W4A4)
#   PART=gtime     replay wall time at 8192 tokens (tools/chain_timeline.py --sweep GLUON_PREFILL=0,1: the present
#                  prefill rows against it, one process, the full checkpoints), both models, three schemes
#                  (MODELS="gpt-oss-120b": one model)
#   PART=gcfg      four other tiles at gpt-oss-120b MXFP4 (the 128-pair one NVFP4 W4A4 too)
#   PART=gmemcheck ~3 min: memcheck over tools/sanitize_kernels.py (its gluon prefill cases new)
#   PART=bench     ~6 min: run-35's bench filter plus triton_bitplace_gluon's 8192-token rows, with
#                  MOE_CONFORMANCE_GLUON_PREFILL=1 (the targets judge each case's best backend); GLUON_BF16=1 also puts
#                  gluon_bf16 in triton_emulation's bf16 prefill row (MOE_CONFORMANCE_GLUON_BF16=1)
#   triton_emulation's bf16 prefill through the Gluon kernel (gluon_bf16, MOE_CONFORMANCE_GLUON_BF16=1):
#   PART=bbfb      ~3 min: suites/test_triton_helpers.py's GPU test (conformance and bit for bit against the bf16 row at
#                  1200 pairs), then bit for bit at each model's sizes (8 experts, 300 and 2048 tokens, block_m 64 and 128)
#   PART=btime     ~5 min: replay wall time at 8192 tokens, the bf16 row against gluon_bf16 at 128-pair blocks (a
#                  program an item, and persistent) and 64 (persistent), both models (MODELS= to limit)
export PYTHONUNBUFFERED=1
BF16_ROW="block_m=128 block_n=128 block_k=64 num_warps=8 num_stages=4 group_m=8 tma=2 w2_block_n=256 tail_m=64 inline_tails=1"
BF16_GLUON="block_m=128 block_n=128 block_k=64 num_warps=4 num_stages=4 maxnreg=168 group_m=8 w2_block_n=256 gluon_bf16=1"
BF16_GLUON_ROW="$BF16_GLUON tail_m=64 inline_tails=1 persistent=1"  # GLUON_BF16_TILES
flags() { local pre=$1; shift; for kv in "$@"; do printf -- "--$pre %s " "$kv"; done; }
mkdir -p $OUT/f
PREFILL_CFG="--config block_m=64 --config block_n=128 --config num_stages=4 --config maxnreg=168 --config group_m=8 --config gluon_prefill=1 --config tile_major=1"
for part in ${PART:-gbfb gtime}; do
case $part in
  gbfb)  # ~2.5 min
    for point in "gpt-oss-120b w_mxfp4" "gpt-oss-120b w_nvfp4_a_nvfp4" "kimi-k2 w_nvfp4"; do
      set -- $point
      timeout 120 python3 tools/bit_for_bit.py --model $1 --scheme $2 --tokens 300 2048 --ref triton_bitplace \
        --ref-config block_m=64 --ref-config num_stages=3 --backend triton_bitplace_gluon $PREFILL_CFG \
        > $OUT/f/bfb-$1-$2.log 2>&1
      echo "bit for bit $1 $2: rc=$?"; grep -E "bit for bit|Error|error" $OUT/f/bfb-$1-$2.log | head -4
    done ;;
  gconf)  # ~2 min: the prefill rows against the reference past the fused routing's pair count (1200 pairs)
    timeout 240 python3 -m pytest -p no:cacheprovider -q suites/test_fp4_bits.py -k past_the_fused \
      > $OUT/f/prefill-conformance.log 2>&1
    echo "prefill conformance: rc=$? $(tail -1 $OUT/f/prefill-conformance.log)"
    grep -E "^(FAILED|ERROR)" $OUT/f/prefill-conformance.log | head -5 ;;
  gtime)  # ~3 min
    for model in ${MODELS:-gpt-oss-120b kimi-k2}; do
      schemes="--scheme w_mxfp4 --scheme w_nvfp4 --scheme w_nvfp4_a_nvfp4"
      timeout 150 python3 tools/chain_timeline.py --model $model $schemes --tokens 8192 --backend \
        triton_bitplace_gluon --replays 5 --sweep GLUON_PREFILL=0,1 > $OUT/f/prefill-$model.log 2>&1
      echo "timeline $model: rc=$?"
      grep -E "median replay" $OUT/f/prefill-$model.log | sed -E 's/ \{.*\}//' | cut -c1-160
    done ;;
  gcfg)  # ~2 min
    for cfg in "block_m=128 block_n=128 num_stages=3 maxnreg=168" "block_m=64 block_n=64 num_stages=3 maxnreg=128" \
               "block_m=64 block_n=128 num_stages=3 maxnreg=168" "block_m=64 block_n=128 num_stages=4 maxnreg=168 group_m=0"; do
      args=""; for kv in group_m=8 gluon_prefill=1 tile_major=1 block_k=128 num_warps=4 $cfg; do args="$args --config $kv"; done
      schemes="--scheme w_mxfp4"
      [[ $cfg == block_m=128* ]] && schemes="$schemes --scheme w_nvfp4_a_nvfp4"  # (NVFP4's decode: issue / MMA 0.80 at 64)
      timeout 150 python3 tools/chain_timeline.py --model gpt-oss-120b $schemes --tokens 8192 --backend \
        triton_bitplace_gluon --replays 5 $args > "$OUT/f/cfg-${cfg// /_}.log" 2>&1
      echo "$cfg: rc=$? $(grep -o 'w_[a-z0-9_]* T=8192.*median replay [0-9.]* us wall' "$OUT/f/cfg-${cfg// /_}.log" \
        | sed -E 's/ triton_bitplace_gluon \{.*\}//' | tr '\n' ' ')"
    done ;;
  bbfb)
    timeout 240 python3 -m pytest -p no:cacheprovider -q suites/test_triton_helpers.py -k gluon_bf16 \
      > $OUT/f/bf16-conformance.log 2>&1
    echo "bf16 gluon conformance + bit for bit: rc=$? $(tail -1 $OUT/f/bf16-conformance.log)"
    grep -E "^(FAILED|ERROR)|Error" $OUT/f/bf16-conformance.log | head -5
    for model in gpt-oss-120b kimi-k2; do
      timeout 150 python3 tools/bit_for_bit.py --model $model --scheme bf16 --tokens 300 2048 --ref triton_emulation \
        $(flags ref-config $BF16_ROW) --backend triton_emulation $(flags config $BF16_GLUON) --sweep block_m=128,64 \
        --sweep persistent=0,1 \
        > $OUT/f/bf16-bfb-$model.log 2>&1
      echo "bf16 bit for bit $model: rc=$?"; grep -E "bit for bit|Error|error" $OUT/f/bf16-bfb-$model.log | head -5
      timeout 150 python3 tools/bit_for_bit.py --model $model --scheme bf16 --tokens 300 2048 --ref triton_emulation \
        $(flags ref-config $BF16_ROW) --backend triton_emulation $(flags config $BF16_GLUON_ROW) --sweep persistent=1,0 \
        > $OUT/f/bf16-bfb-inline-$model.log 2>&1
      echo "bf16 bit for bit, inline tails, $model: rc=$?"
      grep -E "bit for bit|Error|error" $OUT/f/bf16-bfb-inline-$model.log | head -5
    done ;;
  btime)
    for model in ${MODELS:-gpt-oss-120b kimi-k2}; do
      for cfg in "$BF16_ROW" "$BF16_GLUON_ROW" "$BF16_GLUON" "$BF16_GLUON persistent=1" \
                 "${BF16_GLUON/block_m=128/block_m=64} persistent=1"; do
        timeout 200 python3 tools/chain_timeline.py --model $model --scheme bf16 --tokens 8192 \
          --backend triton_emulation --replays 5 $(flags config $cfg) > $OUT/f/bf16-time.log 2>&1
        echo "$model [$cfg]: rc=$? $(grep -o 'median replay [0-9.]* us wall' $OUT/f/bf16-time.log)"
        cat $OUT/f/bf16-time.log >> $OUT/f/bf16-time-$model.log
      done
    done ;;
  gmemcheck)
    timeout 240 compute-sanitizer --tool memcheck python3 tools/sanitize_kernels.py > $OUT/f/memcheck.log 2>&1
    echo "memcheck: rc=$? $(grep -E 'ERROR SUMMARY' $OUT/f/memcheck.log | tail -1)"
    grep -E "gluon (bf16 )?prefill|tile-major" $OUT/f/memcheck.log | head -12 ;;
  bench)  # run-35's bench part (its files in its own tar) with the prefill row on and its rows in the filter
    MOE_CONFORMANCE_GLUON_BF16=${GLUON_BF16:-0} MOE_CONFORMANCE_GLUON_PREFILL=1 BENCH_FILTER='(gpt-oss-120b or kimi-k2) and (T1/ or T8/ or T64/ or T8192/) and ((w_mxfp4/ or w_nvfp4/ or w_nvfp4_a_nvfp4/) and (triton_bitplace_gluon or triton_bitplace and T8192/) or bf16/ and (triton_emulation or torch_grouped_mm) or triton_kernels_ogs and not T8192/)' \
      PART=bench bash results/gpu-issue28/run-35/run-35.sh ;;
esac
done
(cd $OUT && tar czf run-36-${PART// /-}.tgz f && rm -rf f)
