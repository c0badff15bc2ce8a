#!/bin/bash
# Session 13, H200 call 5 (run-9's probes did not start: no PYTHONPATH): triton_emulation's FP8 1x128 quantizer by
# row width and input dtype against the reference; make_checkpoint(device="cuda") against the CPU build.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 90 python3 results/gpu-issue24/run-10/probe_quantizer.py > $OUT/probe_quantizer.log 2>&1
timeout 60 python3 results/gpu-issue24/run-10/probe_checkpoint_device.py > $OUT/probe_checkpoint_device.log 2>&1
cat $OUT/probe_*.log
