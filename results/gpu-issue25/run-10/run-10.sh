#!/bin/bash
# Session 16, H200 (carry .third_party): issue 25's Done-when command after run-8's two failures were fixed (064105d)
# and the W4A4 non-split epilogue quantization went in (c8a78b1). The same script as run-6 in its own directory:
RUN=/tmp/nightly-run10 bash results/gpu-issue25/run-6/run-6.sh
