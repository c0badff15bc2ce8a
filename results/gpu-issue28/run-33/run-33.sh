#!/bin/bash
# Issue 28 run-33 (session 34; H200, carry .third_party). PART may name several parts.
#   PART=ncu1   ~1.5 min: Nsight Compute stall reasons, issue activity and DRAM bytes of the Gluon decode GEMMs at one
#               token and at 8 tokens (gpt-oss-120b MXFP4), and of triton_kernels' _matmul_ogs at one token: the
#               question is why GEMM1 at one token streams at ~2 TB/s (run-24's time line: 35 MB in 17 us) while
#               the same kernel at 8 tokens runs at ~3 TB/s, and why GEMM2 takes ~9 us for 11 K steps from L2
#   PART=sass   ~1.5 min: the Gluon GEMM1's (first profiled launch) warp-stall samples per SASS instruction at one and
#               at 8 tokens (ncu SourceCounters, the report and its source page as CSV): which instructions of the
#               consumer's K step the ~2300 cycles a step (run-7: 62% issue active, 1.2 eligible warps) wait at
#   PART=prefetch ~3 min: w13_prefetch (GEMM1 prefetching its first K chunks of weights into L2 before its wait for
#               the routing launch, its block's expert ranked from the expert ids: gluon_kernels' PDL 3): the rank
#               test compiled (every block's expert against moe_align's oracle), bit for bit against the same
#               kernel without it, then the decode chain's time line with 0 / 4 / 99 chunks
#               (MOE_CONFORMANCE_GLUON_W13_PREFETCH) at one token on both models and at 8 tokens on gpt-oss-120b
#   PART=tile   ~4 min: tile_major (the Gluon GEMMs reading a tile-major copy of the weights: each 64-row tile's K
#               steps one contiguous run, a 4 KB TMA box a step): bit for bit against triton_bitplace (tile_major 0 / 1,
#               split 1 / 2, 1 / 8 / 64 tokens, graph replays), then the decode chain's replay wall time without and
#               with it (MOE_CONFORMANCE_GLUON_TILE_MAJOR) at 1 / 8 / 64 tokens on both models
export PYTHONUNBUFFERED=1
for part in ${PART:-ncu1}; do
case $part in
  ncu1)
    STALLS='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio'
    OTHER=smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__warps_active.avg.per_cycle_active,smsp__warps_eligible.avg.per_cycle_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,lts__t_sector_hit_rate.pct,launch__registers_per_thread,launch__grid_size,gpu__time_duration.sum,smsp__inst_executed.sum,sm__cycles_active.avg
    t0=$(date +%s)
    for point in "gpt-oss-120b triton_bitplace_gluon 1" "gpt-oss-120b triton_bitplace_gluon 8" \
                 "gpt-oss-120b triton_kernels_ogs 1" "kimi-k2 triton_bitplace_gluon 1"; do
      set -- $point
      log=$OUT/ncu-$1-$2-T$3.txt
      timeout 100 ncu --profile-from-start off --clock-control none \
        --kernel-name regex:'bitplace_partials_kernel|_matmul_ogs' --metrics "$STALLS,$OTHER" \
        python3 tools/ncu_moe.py --model $1 --scheme w_mxfp4 --backend $2 --tokens $3 > $log 2>&1
      echo "== $1 $2 T$3: rc=$? ($(( $(date +%s) - t0 )) s)"
      grep -E "bitplace_partials|_matmul_ogs|stalled_(long_scoreboard|barrier|wait|math_pipe|short_scoreboard|mio|no_instr|not_selected|lg_throttle|membar|sleeping)_per|issue_active|eligible|warps_active|dram__|hit_rate|time_duration|grid_size|cycles_active" $log \
        | grep -v -E "^\s*$" | sed -E 's/ +/ /g' | head -40
    done ;;
  prefetch)
    timeout 120 python3 -m pytest -q -p no:cacheprovider suites/test_fp4_bits.py -k "ranks_each or prefetches_its" \
      > $OUT/rank.log 2>&1
    echo "rank tests: rc=$? $(tail -1 $OUT/rank.log)"
    for ms in gpt-oss-120b:w_mxfp4 kimi-k2:w_nvfp4 gpt-oss-120b:w_nvfp4_a_nvfp4; do
      timeout 90 python3 tools/bit_for_bit.py --model ${ms%:*} --scheme ${ms#*:} --tokens 1 8 16 \
        --ref triton_bitplace_gluon --ref-config num_stages=4 --ref-config pdl=1 --backend triton_bitplace_gluon \
        --config num_stages=4 --config pdl=1 --sweep split_k=1,2 --sweep w13_prefetch=4,99 --replays 5 \
        2>&1 | grep -v -i warn >> $OUT/prefetch-bfb.log
      echo "bit for bit $ms: rc=${PIPESTATUS[0]}"
    done
    for point in "gpt-oss-120b w_mxfp4 1" "gpt-oss-120b w_nvfp4_a_nvfp4 1" "kimi-k2 w_mxfp4 1" "gpt-oss-120b w_mxfp4 8"; do
      set -- $point
      for pf in 0 4 99 0; do
        MOE_CONFORMANCE_GLUON_W13_PREFETCH=$pf timeout 60 python3 tools/chain_timeline.py --model $1 --scheme $2 \
          --tokens $3 --backend triton_bitplace_gluon --replays 50 2>&1 | grep -v -i warn > $OUT/timeline-$1-$2-T$3-pf$pf.log
        echo "w13_prefetch $pf: $(grep -m1 'median replay' $OUT/timeline-$1-$2-T$3-pf$pf.log | cut -c1-120)"
        grep -E "bitplace_partials|moe_align" $OUT/timeline-$1-$2-T$3-pf$pf.log | head -2
      done
    done ;;
  tile)
    for ms in gpt-oss-120b:w_mxfp4 kimi-k2:w_nvfp4 gpt-oss-120b:w_nvfp4_a_nvfp4; do
      MOE_CONFORMANCE_GLUON_TILE_MAJOR=1 timeout 100 python3 tools/bit_for_bit.py --model ${ms%:*} --scheme ${ms#*:} \
        --tokens 1 8 64 --ref triton_bitplace --ref-config num_stages=3 --backend triton_bitplace_gluon \
        --config num_stages=4 --config pdl=1 --sweep split_k=1,2 --sweep tile_major=0,1 --replays 3 \
        2>&1 | grep -v -i warn >> $OUT/tile-bfb.log
      echo "bit for bit $ms: rc=${PIPESTATUS[0]}"
    done
    grep -E "False" $OUT/tile-bfb.log | head -5
    for point in "gpt-oss-120b w_mxfp4 1" "gpt-oss-120b w_mxfp4 8" "gpt-oss-120b w_mxfp4 64" "kimi-k2 w_mxfp4 1" \
                 "kimi-k2 w_mxfp4 8" "kimi-k2 w_mxfp4 64" "gpt-oss-120b w_nvfp4_a_nvfp4 8"; do
      set -- $point
      line=""
      for tm in 0 1 0 1; do
        MOE_CONFORMANCE_GLUON_TILE_MAJOR=$tm timeout 60 python3 tools/chain_timeline.py --model $1 --scheme $2 \
          --tokens $3 --backend triton_bitplace_gluon --replays 50 2>&1 | grep -v -i warn > $OUT/tl-$1-$2-T$3-tm$tm.log
        line="$line tm$tm $(grep -m1 -o 'median replay [0-9.]* us' $OUT/tl-$1-$2-T$3-tm$tm.log | cut -d' ' -f3)"
      done
      echo "$1 $2 T$3:$line"
      grep -E "bitplace_partials" $OUT/tl-$1-$2-T$3-tm1.log | head -2
    done
    (cd $OUT && tar czf tile.tgz tl-*.log tile-bfb.log && rm -f tl-*.log tile-bfb.log) ;;
  sass)
    for t in 1 8; do
      rep=$OUT/gemm1-gpt-oss-120b-T$t
      timeout 120 ncu --profile-from-start off --clock-control none --kernel-name bitplace_partials_kernel \
        --launch-count 1 --section SourceCounters --section WarpStateStats --import-source no -f -o $rep \
        python3 tools/ncu_moe.py --model gpt-oss-120b --scheme w_mxfp4 --backend triton_bitplace_gluon --tokens $t \
        > $rep.log 2>&1
      echo "sass T$t: rc=$?"; tail -2 $rep.log
      ncu -i $rep.ncu-rep --page source --csv --print-source sass > $rep-sass.csv 2> $rep-sass.err
      echo "source page: rc=$? $(wc -l < $rep-sass.csv) lines"; head -c 600 $rep-sass.csv; head -3 $rep-sass.err
      ncu -i $rep.ncu-rep --page details > $rep-details.txt 2>&1
      grep -E "Stall|Warp Cycles|Issued|Eligible|Active Warps" $rep-details.txt | head -12
    done ;;
esac
done
