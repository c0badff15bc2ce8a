#!/bin/bash
# Issue 28 run-40 (staged in session 43, not yet run; an H200 or H100, carry .third_party). PART names the parts:
#   PART=tails  ~5 min: NVFP4's tail launch at its own warps and N tile (tail_warps / tail_block_n; run-39's profile:
#               the 8-warp 32-row tails hold a multiprocessor alone at 20-23% tensor-pipe use, 16% of the forward).
#               Compiled for sm90 by Triton 3.6 on the CPU: GEMM1's tail 136 registers x 8 warps (one program a
#               multiprocessor) -> 152 x 4 warps at tail_block_n 64 (three), GEMM2's 86 x 8 (two) -> 100 x 4 (five).
#               First bit for bit against the row as it is (300 and 2048 tokens), then replay wall time at 8192
#               (gpt-oss-120b at tail_m 64 too: half the weight re-reads a tail row, at more padding).
#   PART=ncu    ~1.5 min: the MXFP4 profile run-39 had no time for
# The Done-when run is a call of its own: PART=bench bash results/gpu-issue28/run-35/run-35.sh (>~7 min fresh).
export PYTHONUNBUFFERED=1
mkdir -p $OUT/tails
ROW="--config block_m=128 --config block_n=128 --config block_k=128 --config num_warps=8 --config num_stages=3 --config group_m=8"
for part in ${PART:-tails}; do
case $part in
  tails)
    for scheme in w_nvfp4 w_nvfp4_a_nvfp4; do
      for variant in "tail_warps=4 tail_block_n=64" "tail_warps=4"; do
        cfg=""; for kv in $variant; do cfg="$cfg --config $kv"; done
        timeout 120 python3 tools/bit_for_bit.py --model gpt-oss-120b --scheme $scheme --tokens 300 2048 \
          --ref triton_bitplace --backend triton_bitplace $(echo $ROW | sed 's/--config/--ref-config/g') \
          --ref-config tail_m=32 --ref-config quant_launch=1 $ROW --config tail_m=32 --config quant_launch=1 $cfg \
          2>&1 | grep -v -i warn > $OUT/tails/bfb-$scheme-${variant// /-}.log
        echo "bfb $scheme $variant: $(tail -2 $OUT/tails/bfb-$scheme-${variant// /-}.log | tr '\n' ' ')"
      done
    done
    for point in "gpt-oss-120b 32" "gpt-oss-120b 64" "kimi-k2 64"; do
      set -- $point
      for scheme in w_nvfp4 w_nvfp4_a_nvfp4; do
        for variant in "" "tail_warps=4 tail_block_n=64" "tail_warps=4"; do
          cfg=""; for kv in $variant; do cfg="$cfg --config $kv"; done
          log=$OUT/tails/time-$1-$scheme-${variant// /-}.log
          timeout 60 python3 tools/chain_timeline.py --model $1 --scheme $scheme --tokens 8192 --backend triton_bitplace \
            --replays 5 $ROW --config tail_m=$2 --config quant_launch=1 $cfg 2>&1 | grep -v -i warn > $log
          echo "$1 $scheme [${variant:-the row}]: $(grep -o 'median replay [0-9.]* us' $log)"
        done
      done
    done ;;
  ncu)
    timeout 100 ncu --profile-from-start off --kernel-name moe_gemm_kernel --clock-control none \
      --metrics sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active --section SpeedOfLight \
      --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats \
      python3 tools/ncu_moe.py --model gpt-oss-120b --scheme w_mxfp4 --backend triton_bitplace --tokens 8192 \
      > $OUT/tails/ncu-w_mxfp4.txt 2>&1
    grep -E "moe_gemm_kernel \(|sm__pipe_tensor|L2 Cache Throughput|DRAM Throughput|Duration" $OUT/tails/ncu-w_mxfp4.txt \
      | sed -E 's/ +/ /g' ;;
esac
done
