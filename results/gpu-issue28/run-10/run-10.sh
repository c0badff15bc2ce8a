#!/bin/bash
# Issue 28 run-10 (session 19, H200, carry .third_party): one call, ~6 min.
#   bash results/gpu-issue28/run-10/run-10.sh
# (as run in session 19 the "defaults" lines compared against triton_bitplace at split 3, not at the defaults' own
# split: a different fp32 summation order, so their 9 False say nothing; fixed since, not re-run)
# After run-9: the epilogue kernels compiled without fused multiply-adds (SEPARATE_ROUNDINGS), NVFP4 through the
# Gluon kernel by default, GEMM2 on two-warpgroup programs (w2_block_n 128), programmatic dependent launches where
# GEMM1 is one wave. (1) run-9's NVFP4 mismatches (gpt-oss-120b 8 / 64 tokens, split 1) bit for bit now, and the
# defaults against triton_bitplace; (2) conformance and special values of every Triton backend (the epilogue
# kernels changed for all); (3) make bench: the issue-28 decode rows of triton_bitplace_gluon and triton_kernels_ogs.
export PYTHONUNBUFFERED=1
HOST=$(python3 -m harness platforms --host)
mkdir -p $OUT/run-10
timeout 150 python3 - > $OUT/run-10/smoke.log 2>&1 <<'PY'
import torch
from harness.backends import load_backend
from harness.bench import MODEL_SHAPES, routed_inputs
from reference.checkpoints import make_checkpoint
tiles = dict(block_m=16, block_k=128, num_warps=4)
for scheme, model in (("w_nvfp4", "gpt-oss-120b"), ("w_mxfp4", "gpt-oss-120b"), ("w_nvfp4", "kimi-k2")):
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
            got = g.configure(**tiles, block_n=64, num_stages=4, split_k=split).forward(gp, x, w.float(), ids)
            same = torch.equal(got.view(torch.int16), want.view(torch.int16))
            print(f"{scheme} {model} T={t} split {split}: bit for bit {same}", flush=True)
        g.tiles = None  # the defaults (w2_block_n 128, pdl where it applies) against triton_bitplace at their split
        got = g.forward(gp, x, w.float(), ids)
        split = g.last_launch["w13"][1].get("split_k") or 1
        want = ref.configure(**tiles, block_n=64, num_stages=3, split_k=split).forward(prep, x, w.float(), ids)
        same = torch.equal(got.view(torch.int16), want.view(torch.int16))
        print(f"{scheme} {model} T={t} defaults (split {split}): bit for bit {same}", flush=True)
PY
echo "smoke: rc=$? $(grep -c 'bit for bit True' $OUT/run-10/smoke.log) True, $(grep -c 'bit for bit False' $OUT/run-10/smoke.log) False"
grep -E "False|Error" $OUT/run-10/smoke.log | head
timeout 200 python3 -m pytest -p no:cacheprovider -q -n 12 -m $HOST suites/test_conformance.py \
  suites/test_special_values.py -k "triton and not hypothesis" > $OUT/run-10/conformance.log 2>&1
echo "conformance, Triton backends: rc=$? $(tail -1 $OUT/run-10/conformance.log)"
grep -E "^(FAILED|ERROR)" $OUT/run-10/conformance.log | head -5
t0=$(date +%s)
timeout 200 make bench PY=python3 SETUP= BENCH_ARGS="-k \"(gpt-oss-120b or kimi-k2) and (T1/ or T8/ or T64/) and (w_mxfp4/ or w_nvfp4/) and (triton_bitplace_gluon or triton_kernels_ogs)\"" > $OUT/run-10/bench.log 2>&1
echo "bench: rc=$? $(( $(date +%s) - t0 )) s"
mkdir -p $OUT/run-10/bench && cp bench/table.md bench/results.json bench/targets.md $OUT/run-10/bench/ 2>/dev/null
grep -E "^\| " bench/table.md | head -40
grep -E "^\| " bench/targets.md | head -30
