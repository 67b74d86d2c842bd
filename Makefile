# The two commands a user needs (see README.md): `make demo` and `make test`.
# Both create the virtual environment on first use; nothing else has to be installed but Python.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
DEMO_DIR ?= demo-out

.PHONY: all demo test lint typecheck unit env clean help

help:
	@echo "make demo   run the whole pipeline on an example (no GPU needed)"
	@echo "make test   lint, type-check and run the test suite"
	@echo "make env    only create the virtual environment ($(VENV))"

all: test

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "pyhpctk needs Python >= 3.11; set PYTHON=python3.11 (or newer)")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

env: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples

typecheck: $(STAMP)
	$(VENV)/bin/mypy --strict src

unit: $(STAMP)
	$(PY) -m pytest -n 2 $(PYTEST_ARGS)

test: lint typecheck unit

demo: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash examples/demo.sh $(DEMO_DIR)

clean:
	rm -rf $(VENV) $(DEMO_DIR) .pytest_cache .mypy_cache .ruff_cache
