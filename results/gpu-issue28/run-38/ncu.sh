#!/bin/bash
# Issue 28 run-38 (session 42): Nsight Compute on the prefill GEMMs at 8192 tokens, gpt-oss-120b (an H100 or H200,
# carry .third_party): where the bf16 row (moe_gemm_kernel by TMA, 55.4% of dense bf16 on the H100) and the FP4 rows
# lose time (tensor pipe busy, DRAM throughput, warp stalls). Each launch of moe_gemm_kernel in one forward: GEMM1
# (main and tail launches where the row has them), then GEMM2.
#   bash results/gpu-issue28/run-38/ncu.sh     (~3 min)
export PYTHONUNBUFFERED=1
mkdir -p $OUT/ncu
for spec in "bf16 triton_emulation" "w_nvfp4 triton_bitplace" "w_mxfp4 triton_bitplace"; do
  set -- $spec
  # the tensor pipe's busy share (sm90's wgmma included); where this ncu lacks the metric, the sections alone
  for metrics in "--metrics sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active" ""; do
    timeout 170 ncu --profile-from-start off --kernel-name moe_gemm_kernel --clock-control none $metrics \
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
      --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
      python3 tools/ncu_moe.py --model gpt-oss-120b --scheme $1 --backend $2 --tokens 8192 > $OUT/ncu/ncu-$1.txt 2>&1
    rc=$?
    grep -q "moe_gemm_kernel" $OUT/ncu/ncu-$1.txt && break
  done
  echo "== $1 $2: rc=$rc"
  grep -E "moe_gemm_kernel|^    (Duration|DRAM Throughput|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per Thread|sm__pipe_tensor|Issue Slots Busy|Executed Ipc Active|No Eligible|Block Limit Registers|Block Limit Shared Mem|Dynamic Shared Memory Per Block|Grid Size)" \
    $OUT/ncu/ncu-$1.txt | sed -E 's/ +/ /g' | head -60
  grep -iE "tensor|stall" $OUT/ncu/ncu-$1.txt | head -12 | cut -c1-220
done
