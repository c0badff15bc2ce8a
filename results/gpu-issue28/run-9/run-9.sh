#!/bin/bash
# Issue 28 run-9 (H200, carry .third_party), each part one device call:
#   PART=smoke      bash results/gpu-issue28/run-9/run-9.sh   (~4 min)
#   PART=check      bash results/gpu-issue28/run-9/run-9.sh   (~4 min)
#   PART=tune       bash results/gpu-issue28/run-9/run-9.sh   (~4 min)
#   PART=tune-w2    bash results/gpu-issue28/run-9/run-9.sh   (~1 min)
#   PART=tune-pdl   bash results/gpu-issue28/run-9/run-9.sh   (~1 min)
#   PART=bench      bash results/gpu-issue28/run-9/run-9.sh   (~8 min)
#   PART=tune-quick bash results/gpu-issue28/run-9/run-9.sh   (22 s; what session 18 ran, README.md)
# Session 18 ran the first smoke (block_n 128 only: 48 of 48 bit for bit) and tune-quick (block_n 128 2-8% slower).
# Since then, compiled and counted on the CPU only: GEMM2's own schedule (w2_mma_overlap; schedule 1 pairs two K
# steps an iteration), GEMM2 alone on 128-row programs (w2_block_n), and NVFP4 W4A16 through the Gluon kernel
# (512-byte scale boxes; 428 SASS a step for the gated tiles against moe_gemm_kernel's 531).
# smoke: bit for bit against triton_bitplace at gpt-oss-120b's and Kimi-K2's sizes, MXFP4 and NVFP4, 1 / 8 / 64
# tokens, split 1 / 3, rings 2 / 4 (gpt-oss's 2880 rows leave a 128-row program's second tile past N_OUT: TMA's
# zero fill).
# check: conformance and special values of triton_bitplace_gluon (MXFP4 and NVFP4) with block_n 128 the decode
# default and with GEMM2's schedule 1 the default, then memcheck, synccheck, racecheck (tools/sanitize_kernels.py).
# tune: ring 3 / 4 / 6 x split 1 / 2 x GEMM1's schedule 0 / 1 x GEMM2's 0 / 1 / 2 at 1 / 8 / 64 tokens (MXFP4).
# bench: make bench's MXFP4 and NVFP4 W4A16 rows of triton_bitplace and triton_bitplace_gluon, then the Gluon MXFP4
# rows with block_n 128.
export PYTHONUNBUFFERED=1
export MOE_CONFORMANCE_GLUON_NVFP4=1  # NVFP4 through the Gluon kernel, opt-in until this run checks it
HOST=$(python3 -m harness platforms --host)
case "${PART:-smoke}" in
smoke)
  timeout 540 python3 - > $OUT/smoke.log 2>&1 <<'PY'
import torch
from harness.backends import load_backend
from harness.bench import MODEL_SHAPES, capture, flush_l2, routed_inputs
from reference.checkpoints import make_checkpoint
tiles = dict(block_m=16, block_k=128, num_warps=4)
# (block_n, schedule) variants: two consumer warpgroups (block_n 128); GEMM2 two steps an iteration (schedule 1:
# 23 chunks on gpt-oss, an odd one last; 16 on Kimi-K2; split 3 ways 8 / 8 / 7 and 6 / 6 / 4); NVFP4 (512-byte
# scale boxes, the factors of _nvfp4_factor_words)
# (block_n, schedule, pdl): pdl 1 launches the chain as programmatic dependents (triton_kernels.PDL_ORDER), its
# graph replayed 20 times against the eager forward
variants = {"w_mxfp4": ((128, 0, 0), (128, 2, 0), (64, 1, 0), (64, 0, 1), (128, 1, 1)),
            "w_nvfp4": ((64, 0, 0), (64, 1, 0), (128, 0, 0), (64, 0, 1))}
for scheme, model in (("w_mxfp4", "gpt-oss-120b"), ("w_mxfp4", "kimi-k2"), ("w_nvfp4", "gpt-oss-120b"),
                      ("w_nvfp4", "kimi-k2")):
    shape = MODEL_SHAPES[model]
    ckpt = make_checkpoint(scheme, shape.activation, 8, shape.hidden_size, shape.intermediate_size, seed=0,
                           with_bias=shape.biased)
    ref, g = load_backend("triton_bitplace"), load_backend("triton_bitplace_gluon")
    prep, gp = ref.prepare(ckpt), g.prepare(ckpt)
    for t in (1, 8, 64):
        x, w, _ = routed_inputs(shape, t, "cuda")
        ids = torch.randn(t, 8, generator=torch.Generator().manual_seed(t)).topk(shape.top_k).indices.cuda()
        for split in (1, 3):
            want = ref.configure(**tiles, block_n=64, num_stages=3, split_k=split).forward(prep, x, w.float(), ids)
            for block_n, overlap, pdl in variants[scheme]:
                for stages in (2, 4):
                    got = g.configure(**tiles, block_n=block_n, num_stages=stages, mma_overlap=overlap,
                                      split_k=split, pdl=pdl).forward(gp, x, w.float(), ids)
                    torch.cuda.synchronize()
                    same = torch.equal(got.view(torch.int16), want.view(torch.int16))
                    if pdl:  # graph replays (where the launches overlap) against the eager forward
                        replay, out = capture(lambda: g.launch(gp, x, w.float().contiguous(), ids))
                        for _ in range(20):
                            flush_l2()
                            replay()
                            torch.cuda.synchronize()
                            same = same and torch.equal(out.view(torch.int16), want.view(torch.int16))
                    print(f"{scheme} {model} T={t} split {split} block_n {block_n} overlap {overlap} stages "
                          f"{stages} pdl {pdl}: bit for bit {same}; "
                          f"max |diff| {(got.float() - want.float()).abs().max().item():.3g}", flush=True)
PY
  echo "smoke: rc=$? $(grep -c 'bit for bit True' $OUT/smoke.log) True, $(grep -c 'bit for bit False' $OUT/smoke.log) False"
  grep -E "False|Error" $OUT/smoke.log | head
  ;;
check)
  for env in MOE_CONFORMANCE_GLUON_BLOCK_N=128 MOE_CONFORMANCE_GLUON_OVERLAP=1; do
    env $env timeout 150 python3 -m pytest -p no:cacheprovider -q -n 8 -m $HOST suites/test_conformance.py \
      suites/test_special_values.py -k "triton_bitplace_gluon" > $OUT/conformance-$env.log 2>&1
    echo "conformance, triton_bitplace_gluon, $env: rc=$? $(tail -1 $OUT/conformance-$env.log)"
    grep -E "^(FAILED|ERROR)" $OUT/conformance-$env.log | head -5
  done
  for tool in memcheck synccheck racecheck; do
    timeout 100 compute-sanitizer --tool $tool python3 tools/sanitize_kernels.py > $OUT/$tool.log 2>&1
    echo "$tool: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/$tool.log | tail -1)"
    grep -E "^========= +(Error|Barrier|Invalid|and|at )" $OUT/$tool.log | sort | uniq -c | sort -rn | head -6
  done
  ;;
tune-quick)
  # what session 18's last 2 device minutes ran: block_n 64 / 128 at 4 slots, schedule 0, split 1 / 2 (with
  # tools/tune_moe.py's grid of commit 84fa5aa, where block_n was a sweep key; it is not since)
  mkdir -p $OUT/tune && OUT=$OUT/tune timeout 110 python3 tools/tune_moe.py --case gpt-oss-120b/w_mxfp4/triton_bitplace_gluon \
    --case kimi-k2/w_mxfp4/triton_bitplace_gluon --tokens 1 8 64 --where num_stages=4 --where split_k=1,2 \
    --where mma_overlap=0 > $OUT/tune.log 2>&1
  echo rc=$?; grep -E "T=|best" $OUT/tune.log
  ;;
tune)
  t0=$(date +%s); mkdir -p $OUT/tune
  OUT=$OUT/tune timeout 400 python3 tools/tune_moe.py --case gpt-oss-120b/w_mxfp4/triton_bitplace_gluon \
    --case kimi-k2/w_mxfp4/triton_bitplace_gluon --tokens 1 8 64 --where w2_block_n=64 --where pdl=0 > $OUT/tune.log 2>&1
  echo "tune: rc=$? $(( $(date +%s) - t0 )) s"; grep -E "best|copy bandwidth" $OUT/tune.log
  ;;
tune-w2)
  # GEMM2 alone with two consumer warpgroups a program (w2_block_n 128) in each of its schedules, GEMM1 as default
  t0=$(date +%s); mkdir -p $OUT/tune-w2
  OUT=$OUT/tune-w2 timeout 300 python3 tools/tune_moe.py --case gpt-oss-120b/w_mxfp4/triton_bitplace_gluon \
    --case kimi-k2/w_mxfp4/triton_bitplace_gluon --tokens 1 8 64 --where num_stages=4 --where split_k=1 \
    --where mma_overlap=0 --where pdl=0 > $OUT/tune-w2.log 2>&1
  echo "tune-w2: rc=$? $(( $(date +%s) - t0 )) s"; grep -E "T=|best" $OUT/tune-w2.log
  ;;
tune-pdl)
  # the chain as programmatic dependents (pdl 1) against plain launches, at run-8's default tiles, split 1 / 2
  t0=$(date +%s); mkdir -p $OUT/tune-pdl
  OUT=$OUT/tune-pdl timeout 200 python3 tools/tune_moe.py --case gpt-oss-120b/w_mxfp4/triton_bitplace_gluon \
    --case kimi-k2/w_mxfp4/triton_bitplace_gluon --tokens 1 8 64 --where num_stages=4 --where mma_overlap=0 \
    --where w2_mma_overlap=0 --where w2_block_n=64 > $OUT/tune-pdl.log 2>&1
  echo "tune-pdl: rc=$? $(( $(date +%s) - t0 )) s"; grep -E "T=|best" $OUT/tune-pdl.log
  ;;
bench)
  for bn in 64 128; do
    t0=$(date +%s)
    filter='(gpt-oss-120b or kimi-k2) and (T1/ or T8/ or T64/) and (w_mxfp4/ or w_nvfp4/) and triton_bitplace'
    [ $bn = 128 ] && filter='(gpt-oss-120b or kimi-k2) and (T1/ or T8/ or T64/) and w_mxfp4/ and triton_bitplace_gluon'
    MOE_CONFORMANCE_GLUON_BLOCK_N=$bn timeout $([ $bn = 64 ] && echo 400 || echo 150) make bench PY=python3 SETUP= BENCH_ARGS="-k \"$filter\"" \
      > $OUT/bench-bn$bn.log 2>&1
    echo "bench block_n $bn: rc=$? $(( $(date +%s) - t0 )) s"
    mkdir -p $OUT/bench-bn$bn && cp bench/table.md bench/results.json $OUT/bench-bn$bn/ 2>/dev/null
    grep -E "^\| " bench/table.md | head -12
  done
  ;;
esac
