#!/bin/bash
# Issue 28 run-24 (session 26): run-23's PART=check found warp_spec 1 wrong on the H200 (Triton 3.6: GEMM1 max |diff|
# 10.5 on gpt-oss-120b's row pairs, NaN on Kimi-K2's halves; conformance 10 of 24 bf16 cases failed) while memcheck
# and synccheck were clean. H200, carry .third_party; PART may name several parts.
#   PART=wsbisect ~3 min: bit for bit against the 8-warp tma 1 row at 512 tokens, Kimi-K2 and gpt-oss-120b: warp_spec
#                 2 (the device descriptors and row pairs without specialization: is it the descriptors or the pass?),
#                 warp_spec 1 at 4 warps with 2 / 3 / 4 stages, at 64 columns, at 8 warps
#   PART=tune     ~3 min: tools/tune_moe.py --prefill, bf16, both models, every warp_spec 1 config of its grid at 128 x 128
#                 tiles (4 warps at 2 stages, 8 warps at 2 / 3 / 4 stages)
#   PART=bench    ~4 min: make bench's 8192-token rows of triton_bitplace (MXFP4, NVFP4, NVFP4 W4A4) and of the bf16
#                 kernel on both models, with the table's rows (bf16: tail_m 64 inline; MXFP4: fit_tail_m, inline on
#                 Kimi-K2)
#   PART=align    ~3 min: align_layouts (the prefill routing in three launches, where ~90 torch launches took 400-490 us
#                 before the first GEMM): its CPU tests on the GPU, memcheck of sanitize_kernels, chain_timeline at
#                 8192 tokens (bf16 and MXFP4, both models); then PART=bench times it
#   PART=align2   ~2.5 min: align_layout_kernel's block experts written by expert (one store of every expert a step,
#                 not a [blocks, experts] comparison: 264 us on Kimi-K2 in PART=align): its tests, memcheck, and the
#                 time lines with the routing in torch ops (MOE_CONFORMANCE_PREFILL_ALIGN_TORCH=1) and in the three
#                 launches, in one call (one machine: run-24's loans were different H200s, GEMMs 5% apart)
export PYTHONUNBUFFERED=1
here=$(dirname "$0")
cfg() { for kv in $2; do echo -n " --$1 $kv"; done; }
ROW="block_m=128 block_n=128 block_k=64 num_stages=4 group_m=8 tma=1 w2_block_n=256"
bfb() {  # model, the configuration's changes, sweep
  timeout 150 python3 tools/bit_for_bit.py --model $1 --scheme bf16 --tokens 512 --ref triton_emulation \
    $(cfg ref-config "$ROW num_warps=8") --backend triton_emulation $(cfg config "$ROW $2") --sweep $3 2>&1 \
    | grep -v Warning | grep -E "bit for bit|Error|error" | sed "s|^|$2: |"
}
for part in ${PART:-wsbisect}; do
case $part in
  wsbisect)
    for model in kimi-k2 gpt-oss-120b; do
      bfb $model "num_warps=4" warp_spec=2,1
      bfb $model "num_warps=4 warp_spec=1" num_stages=2,3
      bfb $model "num_warps=4 block_n=64 w2_block_n=64" warp_spec=1
      bfb $model "num_warps=8" warp_spec=1
    done 2>&1 | tee $OUT/wsbisect.log ;;
  tune)
    W="--where block_m=128 --where block_n=128 --where group_m=8 --where persistent=0 --where w2_block_n=256"
    timeout 300 python3 tools/tune_moe.py --prefill --case gpt-oss-120b/bf16/triton_emulation \
      --case kimi-k2/bf16/triton_emulation $W --where warp_spec=1 > $OUT/tune-ws.log 2>&1
    echo "tune warp_spec: rc=$?"; grep -v Warning $OUT/tune-ws.log | grep -E "T=8192|best" | cut -c1-330 ;;
  bench)
    FILTER='(gpt-oss-120b or kimi-k2) and T8192/ and ((w_mxfp4/ or w_nvfp4/ or w_nvfp4_a_nvfp4/) and triton_bitplace and not gluon or bf16/ and triton_emulation)'
    timeout 400 make bench PY=python3 SETUP= BENCH_ARGS="-k \"$FILTER\"" > $OUT/bench-prefill.log 2>&1
    echo "bench prefill: rc=$?"; tail -1 $OUT/bench-prefill.log
    cp bench/table.md bench/targets.md $OUT/ 2>/dev/null; grep -h "T=8192" $OUT/targets.md | cut -c1-220 ;;
  align)
    timeout 200 python3 -m pytest -p no:cacheprovider -q suites/test_triton_helpers.py -k "alignment" \
      > $OUT/align-tests.log 2>&1
    echo "alignment tests on the GPU: rc=$? $(tail -1 $OUT/align-tests.log)"
    timeout 150 compute-sanitizer --tool memcheck python3 tools/sanitize_kernels.py > $OUT/memcheck.log 2>&1
    echo "memcheck: rc=$?"; grep -E "ERROR SUMMARY|align_layouts" $OUT/memcheck.log
    for m in gpt-oss-120b kimi-k2; do
      timeout 100 python3 tools/chain_timeline.py --model $m --tokens 8192 --backend triton_emulation --scheme bf16
      timeout 100 python3 tools/chain_timeline.py --model $m --tokens 8192 --backend triton_bitplace --scheme w_mxfp4
    done 2>&1 | grep -v Warn > $OUT/timeline-prefill.log
    grep -E "median|moe_gemm|align|topk_reduce" $OUT/timeline-prefill.log | cut -c1-120 ;;
  align2)
    timeout 120 python3 -m pytest -p no:cacheprovider -q suites/test_triton_helpers.py -k "alignment" \
      > $OUT/align2-tests.log 2>&1
    echo "alignment tests on the GPU: rc=$? $(tail -1 $OUT/align2-tests.log)"
    timeout 90 compute-sanitizer --tool memcheck python3 -c "
import torch
from harness.backends.triton_emulation import align_layouts
ids = torch.randint(0, 300, (1500, 8), generator=torch.Generator().manual_seed(3)).cuda()
for bm, tm, inline in ((128, 0, False), (128, 32, False), (128, 64, True)):
    print('align_layouts', bm, tm, inline, [int((l[1] >= 0).sum()) for l in align_layouts(ids, 384, bm, tm, inline)])
torch.cuda.synchronize()" > $OUT/memcheck-align.log 2>&1
    echo "memcheck align_layouts: rc=$?"; grep -E "ERROR SUMMARY|align_layouts" $OUT/memcheck-align.log
    for torch_align in 0 1; do
      for m in gpt-oss-120b kimi-k2; do
        MOE_CONFORMANCE_PREFILL_ALIGN_TORCH=$torch_align timeout 60 python3 tools/chain_timeline.py --model $m \
          --tokens 8192 --backend triton_emulation --scheme bf16
        MOE_CONFORMANCE_PREFILL_ALIGN_TORCH=$torch_align timeout 60 python3 tools/chain_timeline.py --model $m \
          --tokens 8192 --backend triton_bitplace --scheme w_mxfp4
      done 2>&1 | grep -v Warn > $OUT/timeline-align-torch-$torch_align.log
      echo "prefill routing in torch ops: $torch_align"
      grep -E "median|moe_gemm|align_|topk_reduce" $OUT/timeline-align-torch-$torch_align.log | cut -c1-120
    done ;;
esac
done
