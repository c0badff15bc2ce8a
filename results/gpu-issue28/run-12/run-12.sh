#!/bin/bash
# Issue 28 run-12 (session 20, H200, carry .third_party), each part one call:
#   PART=tune  bash results/gpu-issue28/run-12/run-12.sh   (~4 min)
#   PART=bench bash results/gpu-issue28/run-12/run-12.sh   (~9 min: a smoke of the one-wave configs, then make bench)
# tune: one token, both models, GEMM1 at block_n 64 / 128 and split 1-4, GEMM2 at w2_block_n 64 / 128, pdl 0 / 1
#   (ring 4, schedule 0): the one-token defaults (run-11: Kimi-K2 at block_n 128 93.2 us against 96.5; triton_kernels'
#   GEMMs alone 87.8); NVFP4 W4A4 through the Gluon kernel likewise (run-11: Kimi-K2 one token 111.4 us against
#   triton_bitplace's 105.4).
# bench: every target of issue 28 from one `make bench` run, with this commit's defaults (the Gluon backend at decode,
#   triton_bitplace at prefill, where the Gluon backend launches the same moe_gemm_kernel).
export PYTHONUNBUFFERED=1
case "${PART:-tune}" in
pdl2) ;;
tune)
  W="--where num_stages=4 --where mma_overlap=0 --where w2_mma_overlap=0"
  timeout 280 python3 tools/tune_moe.py --case kimi-k2/w_mxfp4/triton_bitplace_gluon \
    --case gpt-oss-120b/w_mxfp4/triton_bitplace_gluon --tokens 1 $W > $OUT/tune-t1.log 2>&1
  echo "tune MXFP4: rc=$?"; grep -E "best" $OUT/tune-t1.log
  mv $OUT/tune.json $OUT/tune-t1.json
  MOE_CONFORMANCE_GLUON_QUANTIZED_ACT=1 timeout 200 python3 tools/tune_moe.py \
    --case kimi-k2/w_nvfp4_a_nvfp4/triton_bitplace_gluon --case gpt-oss-120b/w_nvfp4_a_nvfp4/triton_bitplace_gluon \
    --tokens 1 $W --where pdl=0 --where w2_block_n=128 > $OUT/tune-t1-w4a4.log 2>&1
  echo "tune NVFP4 W4A4: rc=$?"; grep -E "best" $OUT/tune-t1-w4a4.log
  mv $OUT/tune.json $OUT/tune-t1-w4a4.json
  python3 - $OUT/tune-t1.json $OUT/tune-t1-w4a4.json <<'PY'
import json, sys
keys = ("block_n", "split_k", "w2_block_n", "pdl")
for path in sys.argv[1:]:
    rows = json.load(open(path))["rows"]
    for model in sorted({r["model"] for r in rows}):
        mine = sorted((r for r in rows if r["model"] == model), key=lambda r: r["us"])
        print(f"== {path.split('/')[-1]} {model} {mine[0]['scheme']}: the six fastest of {len(mine)}")
        for r in mine[:6]:
            print(f"   {r['us']:.1f} us  " + " ".join(f"{k}={r[k]}" for k in keys))
PY
  ;;
bench)
  # first the one-wave rule's new one-token configs bit for bit against triton_bitplace (same rows and split)
  for case in "kimi-k2 w_mxfp4 128 2 128 0" "kimi-k2 w_nvfp4_a_nvfp4 128 2 128 0" "gpt-oss-120b w_nvfp4_a_nvfp4 64 2 64 1"; do
    set -- $case
    timeout 60 python3 tools/bit_for_bit.py --model $1 --scheme $2 --tokens 1 --ref triton_bitplace --ref-config \
      num_stages=3 --backend triton_bitplace_gluon --config num_stages=4 --sweep block_n=$3 --sweep split_k=$4 \
      --config w2_block_n=$5 --config pdl=$6 --replays 5 >> $OUT/smoke.log 2>&1
    echo "$case: rc=$?"
  done
  t0=$(date +%s)
  timeout 500 make bench PY=python3 SETUP= BENCH_ARGS='--durations=12 -k "(gpt-oss-120b or kimi-k2) and (T1/ or T8/ or T64/ or T8192/) and ((w_mxfp4/ or w_nvfp4/ or w_nvfp4_a_nvfp4/) and (triton_bitplace_gluon and not T8192/ or triton_bitplace and not triton_bitplace_gluon and T8192/) or bf16/ and (triton_emulation or torch_grouped_mm) or triton_kernels_ogs and not T8192/)"' \
    > $OUT/bench.log 2>&1
  echo "bench: rc=$? $(( $(date +%s) - t0 )) s"; tail -3 $OUT/bench.log
  mkdir -p $OUT/bench && cp bench/table.md bench/results.json bench/targets.md $OUT/bench/ 2>/dev/null
  grep -E "^\| " bench/targets.md | cut -c1-200 | head -40
  ;;
esac
# PART=pdl2 (written after the bench, ~2 min): pdl 2, the chain as programmatic dependents without GEMM2's L2 prefetch
# (GEMM2 waits at entry as GEMM1 does): bit for bit under graph replays, then timed against pdl 0 / 1 where pdl 1's
# prefetch was slower (GEMM2's weights over 25 MB: Kimi-K2 one token, both models at 8 tokens)
if [ "${PART}" = pdl2 ]; then
  timeout 60 python3 tools/bit_for_bit.py --model kimi-k2 --scheme w_nvfp4 --tokens 1 8 --ref triton_bitplace \
    --ref-config num_stages=3 --backend triton_bitplace_gluon --config num_stages=4 --config w2_block_n=128 \
    --sweep split_k=2 --sweep pdl=2 --replays 5 > $OUT/pdl2-smoke.log 2>&1
  echo "pdl 2 smoke: rc=$? $(grep -c 'bit for bit True' $OUT/pdl2-smoke.log) True"
  W="--where num_stages=4 --where mma_overlap=0 --where w2_mma_overlap=0 --where w2_block_n=128"
  timeout 90 python3 tools/tune_moe.py --case kimi-k2/w_mxfp4/triton_bitplace_gluon --tokens 1 $W --where block_n=128 \
    --where split_k=2 > $OUT/pdl2-t1.log 2>&1; mv $OUT/tune.json $OUT/pdl2-t1.json
  timeout 90 python3 tools/tune_moe.py --case kimi-k2/w_mxfp4/triton_bitplace_gluon \
    --case gpt-oss-120b/w_mxfp4/triton_bitplace_gluon --tokens 8 $W --where block_n=64 --where split_k=1 \
    > $OUT/pdl2-t8.log 2>&1
  grep -hE "^  T=|best" $OUT/pdl2-t1.log $OUT/pdl2-t8.log | sed -E "s/'block_m'.*'pdl'/pdl/"
fi
