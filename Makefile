# PARFusion: `make run` and `make test` do all the set-up on a fresh machine with Python 3.11.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: install run down test test-fast fuzz compose-test lint proto proto-check test-deps clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is required"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

# Debian packages the tests use: chromium (browser tests), docker-compose (compose.yaml check),
# docker.io + debootstrap (compose test on a private engine).
test-deps:
	@bash scripts/install_test_deps.sh

run: install
	$(VENV)/bin/parfusion up

down: install
	$(VENV)/bin/parfusion down

test: install test-deps
	$(PY) -m pytest -q $(PYTEST_ARGS)

# `docker compose up` of a fresh clone on a private dockerd (part of `make test` too; skips
# with the reason where no engine can start). Prints build, image size and up-to-healthy times.
compose-test: install test-deps
	$(PY) -m pytest -q -s tests/deploy/test_compose_engine.py $(PYTEST_ARGS)

test-fast: install
	$(PY) -m pytest -q -m "not slow and not browser" $(PYTEST_ARGS)

# Hostile-input fuzzing of every service (tests/*/test_fuzz.py): FUZZ_EXAMPLES inputs each, new
# random inputs every run (make test runs a fixed few hundred). Results: docs/security.md.
FUZZ_EXAMPLES ?= 10000
fuzz: install
	PARFUSION_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) PARFUSION_FUZZ_RANDOM=1 $(PY) -m pytest -q -p no:cacheprovider \
		--hypothesis-show-statistics --durations=0 --timeout=3600 \
		tests/allocator/test_fuzz.py tests/nodeagent/test_fuzz.py tests/gpulane/test_fuzz.py \
		tests/extender/test_fuzz.py tests/bridge/test_fuzz.py tests/dashboard/test_fuzz.py $(PYTEST_ARGS)

proto: install
	$(PY) -m parfusion.protogen

proto-check: install
	$(PY) -m parfusion.protogen --check

lint: install
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	# services/core is checked with mypy's strict flags (pyproject [[tool.mypy.overrides]])
	$(VENV)/bin/mypy parfusion/cli.py services experiments

clean:
	rm -rf run logs results .pytest_cache .hypothesis
