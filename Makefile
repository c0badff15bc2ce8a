# Two commands do all the set-up on a fresh machine (see README):
#   make test         set up if needed, run everything CI runs (CPU, Hypothesis profile ci)
#   make conformance  set up if needed, run the conformance suites on this machine's platform, write report/
PYTHON ?= python3
VENV   ?= .venv
PY     ?= $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST := $(PY) -m pytest -p no:cacheprovider
# On a machine that brings its own torch (the GPU images): make conformance PY=python3 SETUP=
SETUP  ?= $(STAMP)

.PHONY: test conformance bench browser catalog formats bench-reference clean third-party

# torch==2.13.0 (pinned in pyproject) is the CPU wheel this machine keeps on local disk; pip finds it there.
# AMD Quark without its dependencies (~490 MB: onnx, pandas, pyarrow, scipy, plotly, ...): the peer adapter loads three
# of its modules, which import torch and numpy only, and its C++ extension builds with ninja (the test extra). The
# same pin as pyproject's `quark` extra (the full install), checked by suites/test_ci_workflows.py.
QUARK_PIN := amd-quark==0.13.0
# pip's own byte-compilation runs file by file on one core (~30 s of the set-up here): skipped, then compileall on every
# core (the same .pyc files, ~20 s on two). Its status is not checked: like pip, it leaves the few files that are not
# this Python's syntax uncompiled (torch/testing/_internal/py312_intrinsics.py on 3.11) and says so on stdout.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile -e '.[test,torchao,jax,modelopt,compressed-tensors]'
	$(PY) -m pip install -q --no-compile --no-deps '$(QUARK_PIN)'
	-$(PY) -m compileall -q -j 0 $(VENV)/lib > /dev/null
	touch $(STAMP)

# Pinned third-party kernels (vLLM releases; harness/third_party.py): `pip download --no-deps` of each wheel into
# .third_party/ (git-ignored), only the Python/Triton files kept. Never fails the build: a source that could not be
# fetched (no network, as on the GPU hosts: carry .third_party/ there) is a skip with that reason in the suites.
third-party: $(SETUP)
	-$(PY) -c 'import sys, harness.third_party as t; sys.exit(t.main())'

# The HTML report is checked in a real browser: Debian's chromium, installed here when missing.
# A test that runs past TEST_TIMEOUT_S (the slowest takes ~20 s here) is stopped by pytest-timeout's thread method:
# every thread's stack is dumped and its worker replaced, so a hang (in C code too: a collective, a subprocess) is a
# named failure, not a CI run that stalls until it is killed. Not signal: harness.core.guard owns SIGALRM.
TEST_TIMEOUT_S ?= 300
test: $(SETUP) browser third-party
	MOE_CONFORMANCE_REQUIRE_BROWSER=1 $(PYTEST) --hypothesis-profile=ci -q -n auto --dist worksteal --durations=20 \
		--timeout=$(TEST_TIMEOUT_S) --timeout-method=thread

# This machine's platform (cpu, sm90, ...) decides the cases: `pytest -m <platform>`. The report
# (summary.md, index.html, results.json, histograms/, junit.xml) lands in report/ even when cases fail.
# suites/test_model_shapes.py: the real model shapes on a GPU (every GPU backend, each model's layer and TP share,
# 1/8/64 tokens, at most 3 of its tests on the GPU at once); skipped on a CPU. The default list on the H200: 415 s
# (results/gpu-issue24/run-11).
# PROFILE=nightly SUITES="suites --ignore=suites/bench" is the nightly GPU leg (every suite but the
# benchmarks, which make bench runs; many examples, database written).
# The nightly workflow splits that list into three steps (the real model shapes the third): REPORT=report/<step>.
PROFILE ?= ci
SUITES  ?= suites/test_conformance.py suites/test_parallel_conformance.py suites/test_model_shapes.py
REPORT  ?= report
conformance: $(SETUP) third-party
	rm -rf $(REPORT) && mkdir -p $(REPORT)
	$(PYTEST) $(SUITES) --hypothesis-profile=$(PROFILE) -n auto --dist worksteal --durations=15 -rfE \
		-m "$$($(PY) -m harness platforms --host)" --report=$(REPORT) --junitxml=$(REPORT)/junit.xml

browser:
	@command -v chromium >/dev/null 2>&1 || { \
		SUDO=$$(command -v sudo >/dev/null 2>&1 && [ "$$(id -u)" != 0 ] && echo sudo); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends chromium; }

# GPU benchmarks (suites/bench): pytest-benchmark with CUDA-event timing; bench/ gets benchmark.json,
# table.md, results.json and roofline.png; runs are saved in .benchmarks/ for
# `make bench BENCH_ARGS=--benchmark-compare`. On a CPU the same tests only check correctness.
BENCH_ARGS ?=
bench: $(SETUP)
	mkdir -p bench
	$(PYTEST) suites/bench -p no:xdist --benchmark-timer=harness.bench.cuda_event_timer \
		--benchmark-json=bench/benchmark.json --benchmark-autosave --benchmark-columns=min,median,max,rounds \
		--benchmark-sort=name --bench-dir=bench $(BENCH_ARGS)

# every seeded-bug backend must fail the conformance suite and the correct control must pass (~3 min)
catalog: $(SETUP)
	$(PY) -m harness catalog

formats: $(SETUP)
	$(PY) -m harness formats

bench-reference: $(SETUP)
	$(PY) -m harness bench-reference

clean:
	rm -rf $(VENV) .hypothesis report bench *.egg-info .third_party
