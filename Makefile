# Two commands do all the set-up on a fresh machine: `make test` and `make conformance`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: test conformance venv formats clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -p no:cacheprovider --hypothesis-profile=ci -q

conformance: $(STAMP)
	$(PY) -m pytest --hypothesis-profile=ci -q

formats: $(STAMP)
	$(PY) -m harness formats

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
