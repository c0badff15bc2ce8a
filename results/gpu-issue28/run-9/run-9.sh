#!/bin/bash
# Issue 28 run-9 (written in session 18 for the next loan; H200, carry .third_party):
#   PART=check bash results/gpu-issue28/run-9/run-9.sh   (~5 min; PART=smoke: its first step alone, ~2.5 min)
#   PART=tune  bash results/gpu-issue28/run-9/run-9.sh   (~3 min; PART=tune-quick: the 22-s subset session 18 ran;
#                                                          PART=tune-w2: GEMM2 alone on 128-row programs, ~1 min)
#   PART=bench bash results/gpu-issue28/run-9/run-9.sh   (~3 min)
# The Gluon decode GEMM with two consumer warpgroups a program (block_n 128, TILES 2: 384 threads, 2 programs and 16
# consumer warps a multiprocessor against 12; the activation rows loaded once for both 64-row tiles), compiled on
# the CPU only so far. run-7's ncu: 1.2 eligible of ~3 consumer warps a scheduler, issue 60-65% active, the decode
# chain's latency exposed; triton_kernels' _matmul_ogs runs 16x256 tiles on 8 warps.
# check: bit for bit against triton_bitplace at gpt-oss-120b's and Kimi-K2's sizes (the second tile past N_OUT on
# gpt-oss's 2880 rows: TMA's zero fill), conformance with block_n 128 the decode default, the sanitizers (whose
# cases include block_n 128 unsplit and split 3).
# tune: ring 3 / 4 / 6 x split 1 / 2 x GEMM1's schedule 0 / 1 x GEMM2's 0 / 1 / 2 (w2_mma_overlap; 1 pairs two
# K steps an iteration: two decode chains, 365 SASS per two steps against 188 a step) at 1 / 8 / 64 tokens
# (block_n 128 left the grid after tune-quick).
# bench: make bench's Gluon rows with block_n 64 (the default) and 128, one after the other.
export PYTHONUNBUFFERED=1
HOST=$(python3 -m harness platforms --host)
case "${PART:-check}" in
check|smoke)
  timeout 220 python3 - > $OUT/smoke.log 2>&1 <<'PY'
import torch
from harness.backends import load_backend
from harness.bench import MODEL_SHAPES, routed_inputs
from reference.checkpoints import make_checkpoint
tiles = dict(block_m=16, block_k=128, num_warps=4)
for model in ("gpt-oss-120b", "kimi-k2"):
    shape = MODEL_SHAPES[model]
    ckpt = make_checkpoint("w_mxfp4", shape.activation, 8, shape.hidden_size, shape.intermediate_size, seed=0,
                           with_bias=shape.biased)
    ref, g = load_backend("triton_bitplace"), load_backend("triton_bitplace_gluon")
    prep, gp = ref.prepare(ckpt), g.prepare(ckpt)
    for t in (1, 8, 64):
        x, w, _ = routed_inputs(shape, t, "cuda")
        ids = torch.randn(t, 8, generator=torch.Generator().manual_seed(t)).topk(shape.top_k).indices.cuda()
        for split in (1, 3):
            want = ref.configure(**tiles, block_n=64, num_stages=3, split_k=split).forward(prep, x, w.float(), ids)
            # two consumer warpgroups (block_n 128); GEMM2 two steps an iteration (schedule 1: 23 chunks on
            # gpt-oss, an odd one last; 16 on Kimi-K2; split 3 ways 8 / 8 / 7 and 6 / 6 / 4)
            for block_n, overlap in ((128, 0), (128, 2), (64, 1)):
                for stages in (2, 4):
                    got = g.configure(**tiles, block_n=block_n, num_stages=stages, mma_overlap=overlap,
                                      split_k=split).forward(gp, x, w.float(), ids)
                    torch.cuda.synchronize()
                    same = torch.equal(got.view(torch.int16), want.view(torch.int16))
                    print(f"{model} T={t} split {split} block_n {block_n} overlap {overlap} stages {stages}: "
                          f"bit for bit {same}; "
                          f"max |diff| {(got.float() - want.float()).abs().max().item():.3g}", flush=True)
PY
  echo "smoke: rc=$? $(grep -c 'bit for bit True' $OUT/smoke.log) True, $(grep -c 'bit for bit False' $OUT/smoke.log) False"
  grep -E "False|Error" $OUT/smoke.log | head
  [ "$PART" = smoke ] && exit 0
  MOE_CONFORMANCE_GLUON_BLOCK_N=128 timeout 150 python3 -m pytest -p no:cacheprovider -q -n 8 -m $HOST \
    suites/test_conformance.py suites/test_special_values.py -k "triton_bitplace_gluon" > $OUT/conformance-bn128.log 2>&1
  echo "conformance, triton_bitplace_gluon block_n 128: rc=$? $(tail -1 $OUT/conformance-bn128.log)"
  grep -E "^(FAILED|ERROR)" $OUT/conformance-bn128.log | head -5
  for tool in memcheck synccheck racecheck; do
    timeout 100 compute-sanitizer --tool $tool python3 tools/sanitize_kernels.py > $OUT/$tool.log 2>&1
    echo "$tool: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/$tool.log | tail -1)"
    grep -E "^========= +(Error|Barrier|Invalid|and|at )" $OUT/$tool.log | sort | uniq -c | sort -rn | head -6
  done
  ;;
tune-quick)
  # what session 18's last 2 device minutes ran: block_n 64 / 128 at 4 slots, schedule 0, split 1 / 2
  mkdir -p $OUT/tune && OUT=$OUT/tune timeout 110 python3 tools/tune_moe.py --case gpt-oss-120b/w_mxfp4/triton_bitplace_gluon \
    --case kimi-k2/w_mxfp4/triton_bitplace_gluon --tokens 1 8 64 --where num_stages=4 --where split_k=1,2 \
    --where mma_overlap=0 > $OUT/tune.log 2>&1
  echo rc=$?; grep -E "T=|best" $OUT/tune.log
  ;;
tune)
  t0=$(date +%s); mkdir -p $OUT/tune
  OUT=$OUT/tune timeout 400 python3 tools/tune_moe.py --case gpt-oss-120b/w_mxfp4/triton_bitplace_gluon \
    --case kimi-k2/w_mxfp4/triton_bitplace_gluon --tokens 1 8 64 --where w2_block_n=64 > $OUT/tune.log 2>&1
  echo "tune: rc=$? $(( $(date +%s) - t0 )) s"; grep -E "best|copy bandwidth" $OUT/tune.log
  ;;
tune-w2)
  # GEMM2 alone with two consumer warpgroups a program (w2_block_n 128) in each of its schedules, GEMM1 as default
  t0=$(date +%s); mkdir -p $OUT/tune-w2
  OUT=$OUT/tune-w2 timeout 300 python3 tools/tune_moe.py --case gpt-oss-120b/w_mxfp4/triton_bitplace_gluon \
    --case kimi-k2/w_mxfp4/triton_bitplace_gluon --tokens 1 8 64 --where num_stages=4 --where split_k=1 \
    --where mma_overlap=0 > $OUT/tune-w2.log 2>&1
  echo "tune-w2: rc=$? $(( $(date +%s) - t0 )) s"; grep -E "T=|best" $OUT/tune-w2.log
  ;;
bench)
  for bn in 64 128; do
    t0=$(date +%s)
    MOE_CONFORMANCE_GLUON_BLOCK_N=$bn timeout 250 make bench PY=python3 SETUP= BENCH_ARGS='-k "(gpt-oss-120b or kimi-k2) and (T1/ or T8/ or T64/) and w_mxfp4/ and triton_bitplace_gluon"' \
      > $OUT/bench-bn$bn.log 2>&1
    echo "bench block_n $bn: rc=$? $(( $(date +%s) - t0 )) s"
    mkdir -p $OUT/bench-bn$bn && cp bench/table.md bench/results.json $OUT/bench-bn$bn/ 2>/dev/null
    grep -E "^\| " bench/table.md | head -12
  done
  ;;
esac
