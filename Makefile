# The two commands a user needs (see README.md): `make demo` and `make test`.
# Both create the virtual environment on first use; nothing else has to be installed but Python.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
DEMO_DIR ?= demo-out

.PHONY: all demo test lint typecheck unit env clean help browser test-engine

help:
	@echo "make demo   run the whole pipeline on an example (no GPU needed)"
	@echo "make test   lint, type-check and run the test suite"
	@echo "make env    only create the virtual environment ($(VENV))"

all: test

$(STAMP): pyproject.toml setup.py $(wildcard src/pyhpctk/measure/gpu/cupti/_cuptihook*.[ch]) \
	  $(wildcard src/pyhpctk/measure/engine_c/*) src/pyhpctk/measure/pyframes.h
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "pyhpctk needs Python >= 3.11; set PYTHON=python3.11 (or newer)")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@$(PY) -m pyhpctk.measure.sampling.engine
	@touch $(STAMP)

env: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples
	$(VENV)/bin/ruff format --check src tests benchmarks examples

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

# The timing-sensitive tests (marker "timing": the samplers' accuracy, memory peaks) run alone
# after the others: beside the other xdist worker's load on two cores, each failed now and then.
unit: $(STAMP) browser
	$(PY) -m pytest -n 2 -m "not gpu and not timing" $(PYTEST_ARGS)
	$(PY) -m pytest -m "timing and not gpu" $(PYTEST_ARGS)

test: lint typecheck unit test-engine

# pyrun's sampling engine reads each interpreter's own structures (docs/pyrun.md): its tests
# also run on the other CPython versions it supports, each in a venv of its own (.venv-3.12,
# .venv-3.13) where `pip install -e .` builds the engine for that version. The interpreters
# come from pyenv (`pyenv prefix 3.12`) or from PATH (python3.12).
ENGINE_PYTHONS ?= 3.12 3.13
ENGINE_TESTS ?= tests/test_pyrun_engine.py tests/test_pyrun_native.py tests/test_pyrun_unsampled.py \
	tests/test_pyrun_drain.py tests/test_pyrun_sigtrap.py tests/test_pyrun_windows.py tests/test_pyrun_async.py
ENGINE_SOURCES := setup.py pyproject.toml $(wildcard src/pyhpctk/measure/engine_c/*) \
	  src/pyhpctk/measure/pyframes.h $(wildcard src/pyhpctk/measure/gpu/cupti/_cuptihook*.[ch])

test-engine: $(STAMP)
	@for version in $(ENGINE_PYTHONS); do \
	  python=""; \
	  if command -v pyenv >/dev/null 2>&1 && prefix=$$(pyenv prefix $$version 2>/dev/null); then \
	    python=$$prefix/bin/python$$version; \
	  elif command -v python$$version >/dev/null 2>&1; then python=$$(command -v python$$version); fi; \
	  if [ -z "$$python" ] || [ ! -x "$$python" ]; then \
	    echo "make test-engine: CPython $$version not found (pyenv install $$version, or put python$$version on PATH; ENGINE_PYTHONS= skips)"; exit 1; fi; \
	  venv=.venv-$$version; \
	  if [ ! -f $$venv/.installed-stamp ] || [ -n "$$(find $(ENGINE_SOURCES) -newer $$venv/.installed-stamp 2>/dev/null)" ]; then \
	    test -x $$venv/bin/python || $$python -m venv $$venv || exit 1; \
	    $$venv/bin/python -m pip install --quiet -e . pytest pytest-xdist || exit 1; \
	    $$venv/bin/python -m pyhpctk.measure.sampling.engine || exit 1; \
	    touch $$venv/.installed-stamp; fi; \
	  echo "engine tests on $$($$venv/bin/python -c 'import sys; print(sys.version.split()[0])')"; \
	  $$venv/bin/python -m pytest -p no:cacheprovider -n 2 $(ENGINE_TESTS) || exit 1; \
	done

demo: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash examples/demo.sh $(DEMO_DIR)

clean:
	rm -rf $(VENV) $(VENV)-3.* $(DEMO_DIR) .pytest_cache .mypy_cache .ruff_cache
