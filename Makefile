# The two commands a user needs (see README.md): `make demo` and `make test`.
# Both create the virtual environment on first use; nothing else has to be installed but Python.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
DEMO_DIR ?= demo-out

.PHONY: all demo test lint typecheck unit env clean help browser

help:
	@echo "make demo   run the whole pipeline on an example (no GPU needed)"
	@echo "make test   lint, type-check and run the test suite"
	@echo "make env    only create the virtual environment ($(VENV))"

all: test

$(STAMP): pyproject.toml setup.py $(wildcard src/pyhpctk/measure/gpu/_cuptihook*.[ch])
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

# The HTML report's browser test needs headless Chromium: installed here where apt-get works
# as root (CI, containers); elsewhere install it yourself (e.g. `apt-get install chromium`).
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  command -v google-chrome >/dev/null 2>&1 || \
	  { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	      echo "installing chromium for the browser test"; \
	      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	    else echo "warning: no Chromium found; the browser test will fail (install chromium)"; fi; }

unit: $(STAMP) browser
	$(PY) -m pytest -n 2 $(PYTEST_ARGS)

test: lint typecheck unit

demo: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash examples/demo.sh $(DEMO_DIR)

clean:
	rm -rf $(VENV) $(DEMO_DIR) .pytest_cache .mypy_cache .ruff_cache
