#!/bin/bash
# Issue 28 run-34 (session 35; H200 or H100, carry .third_party). PART may name several parts; every part's files
# go into one tar under $OUT (a call brings back only a few files).
#   PART=ahead  ~4 min: prefetch_ahead (with the tile-major copy, each producer step also prefetches its tiles'
#               weights AHEAD K steps on into L2: STAGES + AHEAD steps in flight while the ring holds STAGES): bit for
#               bit against the same kernel without it (2 / 8 steps, split 1 / 2, 1 / 8 / 64 tokens, graph replays),
#               then the decode chain's replay wall time over GLUON_AHEAD 0,2,4,8,0,4 in one process a point
#               (tools/chain_timeline.py --sweep) at 1 / 8 / 64 tokens on both models, MXFP4
#   PART=stages ~1.5 min: the ring's depth with the tile-major copy (GLUON_STAGES 4,5,6,4) at 8 / 64 tokens
#   PART=bench / check: run-35.sh's (the same commands; this script as it ran, with them, is d560ef1's)
# The ahead part needs d560ef1's tree (prefetch_ahead was removed after it): git checkout d560ef1 first.
export PYTHONUNBUFFERED=1
HOST=$(python3 -m harness platforms --host)
mkdir -p $OUT/f
for part in ${PART:-ahead}; do
case $part in
  ahead)
    for ms in gpt-oss-120b:w_mxfp4 kimi-k2:w_nvfp4 gpt-oss-120b:w_nvfp4_a_nvfp4; do
      timeout 100 python3 tools/bit_for_bit.py --model ${ms%:*} --scheme ${ms#*:} --tokens 1 8 64 \
        --ref triton_bitplace_gluon --ref-config num_stages=4 --ref-config pdl=1 --ref-config tile_major=1 \
        --backend triton_bitplace_gluon --config num_stages=4 --config pdl=1 --config tile_major=1 \
        --sweep split_k=1,2 --sweep prefetch_ahead=2,8 --replays 3 2>&1 | grep -v -i warn >> $OUT/f/ahead-bfb.log
      echo "bit for bit $ms: rc=${PIPESTATUS[0]}"
    done
    grep -E "False|rror" $OUT/f/ahead-bfb.log | head -5
    for point in "gpt-oss-120b 1" "gpt-oss-120b 8" "gpt-oss-120b 64" "kimi-k2 1" "kimi-k2 8" "kimi-k2 64"; do
      set -- $point
      timeout 90 python3 tools/chain_timeline.py --model $1 --scheme w_mxfp4 --tokens $2 \
        --backend triton_bitplace_gluon --replays 30 --sweep GLUON_AHEAD=0,2,4,8,0,4 2>&1 | grep -v -i warn \
        > $OUT/f/ahead-$1-T$2.log
      echo "$1 T$2: $(grep -o 'GLUON_AHEAD=[0-9]*: median replay [0-9.]* us' $OUT/f/ahead-$1-T$2.log \
        | sed -E 's/GLUON_AHEAD=([0-9]*): median replay ([0-9.]*) us/\1:\2/' | tr '\n' ' ')"
    done ;;
  stages)
    for point in "gpt-oss-120b 8" "gpt-oss-120b 64" "kimi-k2 8"; do
      set -- $point
      timeout 90 python3 tools/chain_timeline.py --model $1 --scheme w_mxfp4 --tokens $2 \
        --backend triton_bitplace_gluon --replays 30 --sweep GLUON_STAGES=4,5,6,4 2>&1 | grep -v -i warn \
        > $OUT/f/stages-$1-T$2.log
      echo "$1 T$2: $(grep -o 'GLUON_STAGES=[0-9]*: median replay [0-9.]* us' $OUT/f/stages-$1-T$2.log \
        | sed -E 's/GLUON_STAGES=([0-9]*): median replay ([0-9.]*) us/\1:\2/' | tr '\n' ' ')"
    done ;;
esac
done
(cd $OUT && tar czf run-34-${PART// /-}.tgz f && rm -rf f)
