#!/bin/bash
# Issue 28 run-30 (session 31; an H100 or H200, carry .third_party). PART may name several parts.
#   PART=memcheck  ~3 min: compute-sanitizer memcheck over tools/sanitize_kernels.py (W4A4 now on NVFP4's 8-warp row)
#   PART=w4a4bench ~1 min: make bench's two NVFP4 W4A4 prefill rows (8192 tokens) at the committed row, the lower of
#                  cold and sustained; run-30/bench has the other six rows of the same card's run at the old W4A4 row
#   PART=decode    ~2 min: the MXFP4 gluon decode forward kernel by kernel (chain_timeline, the bench's tiles),
#                  gpt-oss-120b at 1 / 8 / 64 tokens beside Kimi-K2 at 8
export PYTHONUNBUFFERED=1
for part in ${PART:-memcheck}; do
case $part in
  memcheck)
    PART=memcheck bash results/gpu-issue28/run-29/run-29.sh ;;
  w4a4bench)
    FILTER='(gpt-oss-120b or kimi-k2) and T8192/ and w_nvfp4_a_nvfp4/ and triton_bitplace and not gluon'
    timeout 300 make bench PY=python3 SETUP= BENCH_ARGS="-k \"$FILTER\"" > $OUT/bench-w4a4.log 2>&1
    echo "bench w4a4: rc=$?"; tail -1 $OUT/bench-w4a4.log
    cp bench/table.md bench/targets.md $OUT/ 2>/dev/null; grep -h "T=8192" $OUT/targets.md | cut -c1-220
    grep -h "8192" $OUT/table.md ;;
  decode)
    for mt in gpt-oss-120b:1 gpt-oss-120b:8 gpt-oss-120b:64 kimi-k2:8; do
      timeout 60 python3 tools/chain_timeline.py --model ${mt%:*} --tokens ${mt#*:} --backend triton_bitplace_gluon \
        --scheme w_mxfp4 --replays 20 2>&1 | grep -v -i warn
    done > $OUT/decode-timeline.log; grep -E "median|us" $OUT/decode-timeline.log | cut -c1-200 | head -60 ;;
esac
done
