#!/bin/bash
# Issue 28 run-35 (session 36; H200 or H100, carry .third_party). PART may name several parts; every part's files
# go into one tar under $OUT (a call brings back only a few files).
#   PART=sweep  ~3 min: replay wall time of the decode chain (tools/chain_timeline.py --sweep, one process a point)
#               over GEMM2's rows a program (GLUON_W2_BLOCK_N 128,64,128,64) and the launch's register cap
#               (GLUON_MAXNREG 80,64,80,64: 3 or 4 programs a multiprocessor) with the tile-major copy, MXFP4
#   PART=bench  ~9.5 min: every issue-28 target from one make bench run at this tree (run-32's filter, or
#               BENCH_FILTER's); the environment's MOE_CONFORMANCE_GLUON_* settings pass through to it
#   PART=check  ~6.5 min: conformance and special values of triton_bitplace (and _gluon), the NVFP4 factor words'
#               PTX against every code (session 45), memcheck over
#               tools/sanitize_kernels.py (its tile-major cases new); PART=conformance or PART=memcheck runs one half
export PYTHONUNBUFFERED=1
HOST=$(python3 -m harness platforms --host)
mkdir -p $OUT/f
for part in ${PART:-sweep}; do
case $part in
  sweep)
    for knob in GLUON_W2_BLOCK_N=128,64,128,64 GLUON_MAXNREG=80,64,80,64; do
      for point in "gpt-oss-120b 8" "gpt-oss-120b 64" "kimi-k2 8"; do
        set -- $point
        name=${knob%=*}
        timeout 90 python3 tools/chain_timeline.py --model $1 --scheme w_mxfp4 --tokens $2 \
          --backend triton_bitplace_gluon --replays 30 --sweep $knob 2>&1 | grep -v -i warn > $OUT/f/$name-$1-T$2.log
        echo "$name $1 T$2: $(grep -o "$name=[0-9]*: median replay [0-9.]* us" $OUT/f/$name-$1-T$2.log \
          | sed -E "s/$name=([0-9]*): median replay ([0-9.]*) us/\1:\2/" | tr '\n' ' ')"
      done
    done ;;
  bench)
    env | grep MOE_CONFORMANCE_ || echo "no MOE_CONFORMANCE_ settings"
    FILTER=${BENCH_FILTER:-'(gpt-oss-120b or kimi-k2) and (T1/ or T8/ or T64/ or T8192/) and ((w_mxfp4/ or w_nvfp4/ or w_nvfp4_a_nvfp4/) and (triton_bitplace_gluon and not T8192/ or triton_bitplace and not triton_bitplace_gluon and T8192/) or bf16/ and (triton_emulation or torch_grouped_mm) or triton_kernels_ogs and not T8192/)'}
    t0=$(date +%s)
    timeout ${BENCH_TIMEOUT:-585} make bench PY=python3 SETUP= BENCH_ARGS="--durations=12 -k \"$FILTER\"" > $OUT/f/bench.log 2>&1
    echo "bench: rc=$? $(( $(date +%s) - t0 )) s"
    # stopped by timeout's SIGTERM, pytest writes the report of the rows measured after make has gone: wait for it
    for i in $(seq 30); do pgrep -f "pytest -p no:cacheprovider suites/bench" > /dev/null || break; sleep 1; done
    tail -1 $OUT/f/bench.log
    cp bench/table.md bench/results.json bench/targets.md bench/rows.jsonl $OUT/f/ 2>/dev/null
    grep -E "^\| " bench/targets.md | cut -c1-150 ;;
  check|conformance)
    env | grep MOE_CONFORMANCE_ || echo "no MOE_CONFORMANCE_ settings"
    timeout 170 python3 -m pytest -p no:cacheprovider -q -n 8 -m $HOST suites/test_conformance.py \
      suites/test_special_values.py suites/test_fp4_bits.py suites/test_triton_helpers.py \
      -k "triton_bitplace and (mxfp4 or nvfp4) or scales_loaded_a_step or ranks_each or factor_words" \
      > $OUT/f/conformance.log 2>&1
    echo "conformance: rc=$? $(tail -1 $OUT/f/conformance.log)"; grep -E "^(FAILED|ERROR)" $OUT/f/conformance.log | head -5 ;;&
  check|memcheck)
    timeout 330 compute-sanitizer --tool memcheck python3 tools/sanitize_kernels.py > $OUT/f/memcheck.log 2>&1
    echo "memcheck: rc=$? $(grep -E 'ERROR SUMMARY' $OUT/f/memcheck.log | tail -1)"
    grep -E "tile-major" $OUT/f/memcheck.log | head -4 ;;
esac
done
(cd $OUT && tar czf run-35-${PART// /-}.tgz f && rm -rf f)
