#!/bin/bash
# Issue 28 run-8 (session 18, H200, carry .third_party):
#   PART=check bash results/gpu-issue28/run-8/run-8.sh   (~5 min)
#   PART=bench bash results/gpu-issue28/run-8/run-8.sh   (~4 min; the racecheck probe's variants first)
#   PART=ring  bash results/gpu-issue28/run-8/run-8.sh   (~2 min: the Gluon rows at 1, 8 and 64 tokens)
# check: the Gluon decode GEMM after run-7's sanitizer findings: (1) synccheck's "barrier overflow" at the
# producer's cp.async arrive (the incrementing form, 32 threads on a barrier of count 1) is now the .noinc form on
# barriers of count 33; (2) racecheck's hazards, all at the kernel's entry and `if` lines: the same run on a
# probe with Triton's warp_specialize plumbing and nothing of ours (ws_racecheck_probe.py). Then the consumer's
# three schedules (mma_overlap 0/1/2), each bit for bit against triton_bitplace at gpt-oss sizes and through the
# conformance suites, the sanitizers on all three, and a tune sweep of schedule x ring x register cap x split.
# bench: make bench's MXFP4 W4A16 decode rows of issue 28 with the chosen defaults (gluon, bitplace, anchor).
export PYTHONUNBUFFERED=1
HOST=$(python3 -m harness platforms --host)
case "${PART:-check}" in
check)
  timeout 120 python3 - > $OUT/smoke.log 2>&1 <<'PY'
import torch
from harness.backends import load_backend
from harness.bench import MODEL_SHAPES, routed_inputs
from reference.checkpoints import make_checkpoint
shape = MODEL_SHAPES["gpt-oss-120b"]
ckpt = make_checkpoint("w_mxfp4", shape.activation, 8, shape.hidden_size, shape.intermediate_size, seed=0,
                       with_bias=shape.biased)
ref = load_backend("triton_bitplace")
prep = ref.prepare(ckpt)
g = load_backend("triton_bitplace_gluon")
gp = g.prepare(ckpt)
tiles = dict(block_m=16, block_n=64, block_k=128, num_warps=4)
for t in (1, 8, 64):
    x, w, _ = routed_inputs(shape, t, "cuda")
    ids = torch.randn(t, 8, generator=torch.Generator().manual_seed(t)).topk(shape.top_k).indices.cuda()
    for split in (1, 3):
        want = ref.configure(**tiles, num_stages=3, split_k=split).forward(prep, x, w.float(), ids)
        for overlap in (0, 1, 2):
            for stages in (2, 4, 6):
                got = g.configure(**tiles, num_stages=stages, mma_overlap=overlap, split_k=split).forward(
                    gp, x, w.float(), ids)
                torch.cuda.synchronize()
                same = torch.equal(got.view(torch.int16), want.view(torch.int16))
                print(f"T={t} split {split} overlap {overlap} stages {stages}: bit for bit {same}; max |diff| "
                      f"{(got.float() - want.float()).abs().max().item():.3g}")
PY
  echo "smoke: rc=$? $(grep -c True $OUT/smoke.log) True, $(grep -c False $OUT/smoke.log) False"; grep False $OUT/smoke.log | head
  for ov in 0 1 2; do
    MOE_CONFORMANCE_GLUON_OVERLAP=$ov timeout 150 python3 -m pytest -p no:cacheprovider -q -n 8 -m $HOST \
      suites/test_conformance.py suites/test_special_values.py -k "triton_bitplace_gluon" > $OUT/conformance-ov$ov.log 2>&1
    echo "conformance, triton_bitplace_gluon overlap $ov: rc=$? $(tail -1 $OUT/conformance-ov$ov.log)"
    grep -E "^(FAILED|ERROR)" $OUT/conformance-ov$ov.log | head -5
  done
  for tool in memcheck racecheck synccheck; do
    timeout 90 compute-sanitizer --tool $tool python3 tools/sanitize_kernels.py > $OUT/$tool.log 2>&1
    echo "$tool: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/$tool.log | tail -1)"
    grep -E "^========= +(Error|Barrier|and|at )" $OUT/$tool.log | sort | uniq -c | sort -rn | head -8
  done
  for tool in racecheck synccheck; do
    timeout 60 compute-sanitizer --tool $tool python3 results/gpu-issue28/run-8/ws_racecheck_probe.py > $OUT/probe-$tool.log 2>&1
    echo "probe $tool: rc=$? $(grep -E 'ws probe|ERROR SUMMARY|RACECHECK SUMMARY' $OUT/probe-$tool.log | tr '\n' ' ')"
    grep -E "^========= +(Error|Barrier|and)" $OUT/probe-$tool.log | sort | uniq -c | sort -rn | head -6
  done
  t0=$(date +%s); mkdir -p $OUT/tune
  OUT=$OUT/tune timeout 200 python3 tools/tune_moe.py --case gpt-oss-120b/w_mxfp4/triton_bitplace_gluon \
    --case kimi-k2/w_mxfp4/triton_bitplace_gluon --tokens 1 8 64 --where maxnreg=80 > $OUT/tune-gluon.log 2>&1
  echo "tune: rc=$? $(( $(date +%s) - t0 )) s"; grep -E "best|copy bandwidth" $OUT/tune-gluon.log
  ;;
bench)
  # first the probe's three variants under racecheck (which of our consumer's habits brings the hazard pattern)
  timeout 90 compute-sanitizer --tool racecheck python3 results/gpu-issue28/run-8/ws_racecheck_probe.py > $OUT/probe2-racecheck.log 2>&1
  echo "probe racecheck: rc=$?"; grep -vE "Host Frame" $OUT/probe2-racecheck.log | grep -E "ws probe|Race|and Write|and Read|SUMMARY" | head -20
  t0=$(date +%s)
  timeout 540 make bench PY=python3 SETUP= BENCH_ARGS='-k "(gpt-oss-120b or kimi-k2) and (T1/ or T8/ or T64/) and w_mxfp4/ and (triton_bitplace or triton_kernels_ogs)"' \
    > $OUT/bench.log 2>&1
  echo "bench: rc=$? $(( $(date +%s) - t0 )) s"
  mkdir -p $OUT/bench && cp bench/table.md bench/results.json bench/targets.md $OUT/bench/ 2>/dev/null
  grep -E "^\| " bench/table.md | head -30
  ;;
ring)
  # the Gluon rows at 1, 8 and 64 tokens. Ran twice in session 18 with a ring-depth rule in the tree (6 slots where
  # the launch fits in one wave; then the deepest ring that adds no wave): both slower, both removed, so on the
  # tree as committed this times the plain 4-slot ring (run-8/ring-*/ hold the two runs)
  t0=$(date +%s)
  timeout 300 make bench PY=python3 SETUP= BENCH_ARGS='-k "(gpt-oss-120b or kimi-k2) and (T1/ or T8/ or T64/) and w_mxfp4/ and triton_bitplace_gluon"' \
    > $OUT/bench-ring.log 2>&1
  echo "bench: rc=$? $(( $(date +%s) - t0 )) s"
  mkdir -p $OUT/bench-ring && cp bench/table.md bench/results.json $OUT/bench-ring/ 2>/dev/null
  grep -E "^\| " bench/table.md | head -12
  ;;
esac
