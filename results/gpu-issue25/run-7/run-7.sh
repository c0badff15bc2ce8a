#!/bin/bash
# Session 14, H200 (carry .third_party): run-6 again after its fixes (commit adfb43b+): the nightly leg in one command,
# detached, collected by a second call of this script.
RUN=/tmp/nightly-run7 bash results/gpu-issue25/run-6/run-6.sh
