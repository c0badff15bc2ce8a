#!/bin/bash
# Issue 28 run-31 (session 31; an H100 or H200, carry .third_party): moe_align_kernel's new steps.
#   PART=align   ~1.5 min: the fused alignment's tests compiled (against _align_torch; NVFP4 values in the same
#                launch), then align_steps.py (old steps, each new step, all new, at make bench's decode points)
#   PART=decode  ~2 min: the MXFP4 gluon decode forward kernel by kernel at the new steps (run-30 PART=decode, plus
#                Kimi-K2 at 64 tokens)
export PYTHONUNBUFFERED=1
for part in ${PART:-align}; do
case $part in
  align)
    timeout 120 python3 -m pytest -p no:cacheprovider -q suites/test_triton_helpers.py \
      -k "fused_alignment or routing_launch" > $OUT/align-tests.log 2>&1
    echo "alignment tests: rc=$? $(tail -1 $OUT/align-tests.log)"; grep -E "^(FAILED|ERROR)" $OUT/align-tests.log | head
    timeout 150 python3 results/gpu-issue28/run-31/align_steps.py 2>&1 | grep -v -i warn | tee $OUT/align-steps.log ;;
  decode)
    for mt in gpt-oss-120b:1 gpt-oss-120b:8 gpt-oss-120b:64 kimi-k2:8 kimi-k2:64; do
      timeout 60 python3 tools/chain_timeline.py --model ${mt%:*} --tokens ${mt#*:} --backend triton_bitplace_gluon \
        --scheme w_mxfp4 --replays 20 2>&1 | grep -v -i warn
    done > $OUT/decode-timeline.log; grep -E "median|align" $OUT/decode-timeline.log | cut -c1-200 ;;
esac
done
