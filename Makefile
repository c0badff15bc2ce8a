# Two commands do all the set-up on a fresh machine (see README):
#   make test         set up if needed, run everything CI runs (CPU, Hypothesis profile ci)
#   make conformance  set up if needed, run the conformance suites on this machine's platform, write report/
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST := $(PY) -m pytest -p no:cacheprovider

.PHONY: test conformance catalog formats bench-reference clean

# torch==2.13.0 (pinned in pyproject) is the CPU wheel this machine keeps on local disk; pip finds it there.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,torchao]'
	touch $(STAMP)

test: $(STAMP)
	$(PYTEST) --hypothesis-profile=ci -q -n auto

conformance: $(STAMP)
	mkdir -p report
	$(PYTEST) --hypothesis-profile=ci -q --junitxml=report/junit.xml

# every seeded-bug backend must fail the conformance suite and the correct control must pass (~3 min)
catalog: $(STAMP)
	$(PY) -m harness catalog --workers 2

formats: $(STAMP)
	$(PY) -m harness formats

bench-reference: $(STAMP)
	$(PY) -m harness bench-reference

clean:
	rm -rf $(VENV) .hypothesis report *.egg-info
