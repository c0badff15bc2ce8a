#!/bin/bash
# Issue 28 run-7 (written in session 17 for the next loan, H200, carry .third_party), three calls:
#   PART=check bash results/gpu-issue28/run-7/run-7.sh   (~5 min; at most 540 s)
#   PART=bench bash results/gpu-issue28/run-7/run-7.sh   (~5 min)
#   PART=ncu   bash results/gpu-issue28/run-7/run-7.sh   (~4 min; the Firecracker runtime, where ncu reads counters)
#   PART=tune  bash results/gpu-issue28/run-7/run-7.sh   (~4 min; after check passes)
# check: the warp-specialised Gluon decode GEMM (harness/backends/gluon_kernels.py: a TMA producer warp, a decoding
# warpgroup; 343 SASS per K step against moe_gemm_kernel's 439, counted on the CPU, never run before this) as the
# registered backend triton_bitplace_gluon: its conformance and special-value cases on sm90 (explicit and
# Hypothesis; every decode-size case goes through the kernel), then memcheck, racecheck and synccheck of its
# launches (tools/sanitize_kernels.py: unsplit and split 3 ways). A hang (a wrong barrier phase) is cut by the
# timeouts.
# bench: MXFP4 W4A16 decode on gpt-oss-120b and Kimi-K2 at 1 / 8 / 64 tokens: triton_bitplace, triton_bitplace_gluon
# and triton_kernels' matmul_ogs in one make bench run.
# ncu: WHY the decode GEMM issues an instruction only every ~1.7 cycles per scheduler
# (results/gpu-issue15-bitplace/run-ae6f326/ncu.txt: 0.59 issued per cycle, 1.15 eligible of 3.6 active warps):
# ncu's stall reasons per issued instruction for moe_gemm_kernel, the Gluon kernel and triton_kernels' _matmul_ogs.
export PYTHONUNBUFFERED=1
HOST=$(python3 -m harness platforms --host)
case "${PART:-check}" in
check)
  # smoke first (a hang costs 90 s, not the suite's 330): gpt-oss-120b's expert sizes, 8 experts, 1 / 8 / 64 tokens,
  # the Gluon backend against triton_bitplace (the same fp32 sums in the same wgmma order: bit for bit expected)
  timeout 90 python3 - > $OUT/smoke-gluon.log 2>&1 <<'PY'
import torch
from harness.backends import load_backend
from harness.bench import MODEL_SHAPES, routed_inputs
from reference.checkpoints import make_checkpoint
shape = MODEL_SHAPES["gpt-oss-120b"]
ckpt = make_checkpoint("w_mxfp4", shape.activation, 8, shape.hidden_size, shape.intermediate_size, seed=0,
                       with_bias=shape.biased)
outs = {}
for name in ("triton_bitplace", "triton_bitplace_gluon"):
    b = load_backend(name)
    prep = b.prepare(ckpt)
    for t in (1, 8, 64):
        x, w, _ = routed_inputs(shape, t, "cuda")
        ids = torch.randn(t, 8, generator=torch.Generator().manual_seed(t)).topk(shape.top_k).indices.cuda()
        outs[name, t] = b.forward(prep, x, w.float(), ids)
        torch.cuda.synchronize()
for t in (1, 8, 64):
    a, g = outs["triton_bitplace", t], outs["triton_bitplace_gluon", t]
    same = torch.equal(a.view(torch.int16), g.view(torch.int16))
    print(f"T={t}: bit for bit {same}; max |diff| {(a.float() - g.float()).abs().max().item():.3g}; finite {bool(torch.isfinite(g).all())}")
PY
  echo "smoke: rc=$?"; cat $OUT/smoke-gluon.log | tail -5
  timeout 330 python3 -m pytest -p no:cacheprovider -q -n 8 -m $HOST suites/test_conformance.py \
    suites/test_special_values.py -k "triton_bitplace_gluon" > $OUT/conformance-gluon.log 2>&1
  echo "conformance, triton_bitplace_gluon: rc=$? $(tail -1 $OUT/conformance-gluon.log)"
  grep -E "^(FAILED|ERROR)" $OUT/conformance-gluon.log | head -20
  for tool in memcheck racecheck synccheck; do
    timeout 70 compute-sanitizer --tool $tool python3 tools/sanitize_kernels.py > $OUT/$tool-gluon.log 2>&1
    echo "$tool: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/$tool-gluon.log | tail -1)"
  done
  ;;
bench)
  t0=$(date +%s)
  timeout 540 make bench PY=python3 SETUP= BENCH_ARGS='-k "(gpt-oss-120b or kimi-k2) and (T1/ or T8/ or T64/) and w_mxfp4/ and (triton_bitplace or triton_kernels_ogs)"' \
    > $OUT/bench-gluon.log 2>&1
  echo "bench: rc=$? $(( $(date +%s) - t0 )) s"
  mkdir -p $OUT/bench && cp bench/table.md bench/results.json $OUT/bench/ 2>/dev/null
  grep -E "^\| " bench/table.md | head -30
  ;;
tune)
  # the Gluon kernel's ring depth (3 / 4 / 6), register cap (64 / 80) and split_k (1 / 2 / 4) at 1, 8, 64 tokens
  t0=$(date +%s); mkdir -p $OUT/tune
  OUT=$OUT/tune timeout 400 python3 tools/tune_moe.py --case gpt-oss-120b/w_mxfp4/triton_bitplace_gluon \
    --case kimi-k2/w_mxfp4/triton_bitplace_gluon --tokens 1 8 64 > $OUT/tune-gluon.log 2>&1
  echo "tune: rc=$? $(( $(date +%s) - t0 )) s"; grep -E "best|copy bandwidth" $OUT/tune-gluon.log
  ;;
ncu)
  STALLS='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio'
  OTHER=smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__warps_active.avg.per_cycle_active,smsp__warps_eligible.avg.per_cycle_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__registers_per_thread,launch__grid_size,gpu__time_duration.sum,smsp__inst_executed.sum
  t0=$(date +%s)
  for point in "gpt-oss-120b triton_bitplace 8 0" "gpt-oss-120b triton_bitplace 8 1" "gpt-oss-120b triton_bitplace 64 0" \
               "gpt-oss-120b triton_bitplace 64 1" "gpt-oss-120b triton_kernels_ogs 8 0" "kimi-k2 triton_bitplace 8 0"; do
    set -- $point
    log=$OUT/ncu-$1-$2-T$3-gluon$4.txt
    MOE_CONFORMANCE_BITPLACE_GLUON=$4 timeout 100 ncu --profile-from-start off --clock-control none \
      --kernel-name regex:'moe_gemm_kernel|bitplace_partials_kernel|_matmul_ogs' --metrics "$STALLS,$OTHER" \
      python3 tools/ncu_moe.py --model $1 --scheme w_mxfp4 --backend $2 --tokens $3 > $log 2>&1
    echo "== $1 $2 T$3 gluon=$4: rc=$? ($(( $(date +%s) - t0 )) s)"
    grep -E "moe_gemm_kernel|bitplace_partials|_matmul_ogs|stalled_(long_scoreboard|barrier|wait|math_pipe|short_scoreboard|mio|dispatch|no_instr|not_selected|lg_throttle)|issue_active|eligible|warps_active|dram__|time_duration" $log \
      | sed -E 's/ +/ /g' | head -40
  done
  ;;
esac
