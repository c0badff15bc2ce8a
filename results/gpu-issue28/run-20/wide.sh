#!/bin/bash
# Issue 28 run-20, second call (session 23; H200, carry .third_party; ~6 min): the bit-placement prefill loop with
# 128 weight rows a program on two warpgroups (block_n 128, 8 warps; 255 registers, no spill for MXFP4 in the CPU
# compile, where 64 rows on one warpgroup spill 4 bytes) and mma_steps 2, against the committed rows; conformance of
# the wide tiles at every size (fp4_backends.py).
export PYTHONUNBUFFERED=1
HOST=$(python3 -m harness platforms --host)
D=results/gpu-issue28/run-20
PYTHONPATH=$D timeout 100 python3 -m pytest -p no:cacheprovider -q -n 8 -m $HOST --backend fp4_backends:bitplace_wide \
  suites/test_conformance.py suites/test_special_values.py -k "mxfp4 or nvfp4" > $OUT/conformance-wide.log 2>&1
echo "conformance, wide bit-placement tiles at every size: rc=$? $(tail -1 $OUT/conformance-wide.log)"
grep -E "^(FAILED|ERROR)" $OUT/conformance-wide.log | head -5
W="--where num_stages=3 --where group_m=8 --where tma=0 --where persistent=0"
timeout 230 python3 tools/tune_moe.py --prefill --case gpt-oss-120b/w_mxfp4/triton_bitplace \
  --case kimi-k2/w_mxfp4/triton_bitplace $W --where block_m=128 --where tail_m=32,64 --where block_n=64,128 \
  --where mma_steps=1,2 > $OUT/tune-wide-mx.log 2>&1
echo "tune mxfp4: rc=$?"; grep "T=8192" $OUT/tune-wide-mx.log | sed "s/.block_m.: 128, //; s/'block_k.*'group_m': 8, 'tma': 0, //"
timeout 150 python3 tools/tune_moe.py --prefill --case kimi-k2/w_nvfp4_a_nvfp4/triton_bitplace \
  --case gpt-oss-120b/w_nvfp4_a_nvfp4/triton_bitplace $W --where block_m=64 --where tail_m=0 --where block_n=64,128 \
  --where mma_steps=1 > $OUT/tune-wide-nv.log 2>&1
echo "tune nvfp4: rc=$?"; grep "T=8192" $OUT/tune-wide-nv.log | sed "s/'block_k.*'group_m': 8, 'tma': 0, //"
