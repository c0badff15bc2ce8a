#!/bin/bash
# Issue 28 run-32 (session 33; H200, carry .third_party). PART may name several parts.
#   PART=bfb    ~2.5 min: scale_regs (the bit-placement loop's block scales a K step ahead in registers by plain
#               loads, so that NVFP4's 128-row 4-warp GEMM1 takes 112 KB, not 114, and two programs share a
#               multiprocessor) bit for bit against scale_regs 0 at the models' sizes (prefill tiles at 100 and 600
#               tokens; decode tiles split 1 / 3 at 1 and 8 tokens)
#   PART=check  ~4 min: conformance and special values of triton_bitplace, scale_regs' CPU test compiled, memcheck
#               over tools/sanitize_kernels.py (its new scale_regs cases)
#   PART=tune   ~4 min:   NVFP4 W4A16 and W4A4 prefill at 8192 tokens (tune_moe, sustained): the 8-warp 128-row
#               row (the table's on Triton 3.6) against the 4-warp 128-row tile with and without scale_regs
#   PART=bench  ~8 min: every issue-28 target from one make bench run (run-14's bench.sh filter) at this tree
export PYTHONUNBUFFERED=1
HOST=$(python3 -m harness platforms --host)
for part in ${PART:-check}; do
case $part in
  bfb)
    P="--ref-config block_m=128 --ref-config block_n=64 --ref-config num_stages=3 --ref-config group_m=8"
    C="--config block_m=128 --config block_n=64 --config num_stages=3 --config group_m=8"
    for ms in gpt-oss-120b:w_nvfp4 gpt-oss-120b:w_nvfp4_a_nvfp4 kimi-k2:w_nvfp4 gpt-oss-120b:w_mxfp4; do
      m=${ms%:*}; s=${ms#*:}
      timeout 60 python3 tools/bit_for_bit.py --model $m --scheme $s --tokens 100 600 --ref triton_bitplace $P \
        --ref-config tail_m=32 --backend triton_bitplace $C --config tail_m=32 --config scale_regs=1
      echo "$m $s prefill: rc=$?"
    done 2>&1 | grep -v -i warn | tee $OUT/bfb.log | grep -E "rc=|differ|Error" | head -20
    timeout 60 python3 tools/bit_for_bit.py --model kimi-k2 --scheme w_nvfp4_a_nvfp4 --tokens 1 8 --ref triton_bitplace \
      --ref-config num_stages=3 --backend triton_bitplace --config num_stages=3 --config scale_regs=1 \
      --sweep split_k=1,3 2>&1 | grep -v -i warn | tee -a $OUT/bfb.log | tail -5
    echo "kimi-k2 w_nvfp4_a_nvfp4 decode: rc=${PIPESTATUS[0]}" ;;
  check)
    timeout 150 python3 -m pytest -p no:cacheprovider -q -n 8 -m $HOST suites/test_conformance.py \
      suites/test_special_values.py suites/test_fp4_bits.py \
      -k "triton_bitplace and (mxfp4 or nvfp4) or scales_loaded_a_step" > $OUT/conformance.log 2>&1
    echo "conformance: rc=$? $(tail -1 $OUT/conformance.log)"; grep -E "^(FAILED|ERROR)" $OUT/conformance.log | head -5
    timeout 150 compute-sanitizer --tool memcheck python3 tools/sanitize_kernels.py > $OUT/memcheck.log 2>&1
    echo "memcheck: rc=$? $(grep -E 'ERROR SUMMARY' $OUT/memcheck.log | tail -1)" ;;
  tune)
    W="--where block_m=128 --where num_stages=3 --where group_m=8 --where tma=0 --where persistent=0
       --where mma_steps=1 --where inline_tails=0"
    for mt in gpt-oss-120b:32 kimi-k2:64; do m=${mt%:*}
      for sr in 0 1; do  # scale_regs 0: the 8-warp row and the 4-warp tile; 1: the 4-warp tile
        warps=$([ $sr = 0 ] && echo 4,8 || echo 4)
        mkdir -p $OUT/$m-$sr; OUT=$OUT/$m-$sr timeout 130 python3 tools/tune_moe.py --tokens 8192 \
          --case $m/w_nvfp4/triton_bitplace --case $m/w_nvfp4_a_nvfp4/triton_bitplace $W --where tail_m=${mt#*:} \
          --where num_warps=$warps --set scale_regs=$sr 2>&1 | grep -v -i warn > $OUT/tune-$m-$sr.log
        echo "tune $m scale_regs $sr: rc=${PIPESTATUS[0]}"; grep -E "T=8192|Error" $OUT/tune-$m-$sr.log | cut -c1-260
      done
    done ;;
  bench)  # run-14's bench.sh with 25 s more (make bench now reads each judged prefill row cold and sustained)
    FILTER='(gpt-oss-120b or kimi-k2) and (T1/ or T8/ or T64/ or T8192/) and ((w_mxfp4/ or w_nvfp4/ or w_nvfp4_a_nvfp4/) and (triton_bitplace_gluon and not T8192/ or triton_bitplace and not triton_bitplace_gluon and T8192/) or bf16/ and (triton_emulation or torch_grouped_mm) or triton_kernels_ogs and not T8192/)'
    t0=$(date +%s)
    timeout 585 make bench PY=python3 SETUP= BENCH_ARGS="--durations=12 -k \"$FILTER\"" > $OUT/bench.log 2>&1
    echo "bench: rc=$? $(( $(date +%s) - t0 )) s"; tail -1 $OUT/bench.log
    cp bench/table.md bench/results.json bench/targets.md $OUT/ 2>/dev/null
    grep -E "^\| " bench/targets.md | cut -c1-150 ;;
esac
done
