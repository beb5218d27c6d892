# Every target installs what it needs into .venv, so a clean clone needs only Python 3.10+.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test test-stacks test-bench lint typecheck pytest gql-suite demo examples soak bench docs docs-screenshots matrix sdist-check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Reinstall only when the project's metadata changed.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# The CI workflow for a public forge too: against the schema of workflow files, and by
# zizmor's security audits (offline: no lookups of the actions' repositories).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/check-jsonschema --builtin-schema vendor.github-workflows .github/workflows/*.yml
	$(BIN)/check-jsonschema --builtin-schema vendor.dependabot .github/dependabot.yml
	$(BIN)/zizmor --offline --quiet .github/

typecheck: $(STAMP)
	$(BIN)/mypy

# How many pytest worker processes make test runs (pytest-xdist). Three on two cores: the
# tests wait on subprocesses, sockets and timers more than they compute (measured on 2 cores:
# 229 s with 2 workers, 209 s with 3).
PYTEST_WORKERS ?= 3

# coverage run, not pytest-cov: the pytest11 plugin is imported before pytest-cov starts.
# The workers are subprocesses, measured by coverage's subprocess patch (pyproject.toml).
# loadgroup keeps each xdist_group (a module-scoped fixture's users) in one worker.
# COVERAGE=0 runs the suite without it: a quarter less time (make test COVERAGE=0).
COVERAGE ?= 1

pytest: $(STAMP)
ifeq ($(COVERAGE),0)
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup
else
	rm -f .coverage .coverage.*
	$(BIN)/coverage run -m pytest -n $(PYTEST_WORKERS) --dist loadgroup
	$(BIN)/coverage combine -q
	$(BIN)/coverage report
endif

# gql's own aiohttp transport tests, from the sdist of the installed gql (fetched once into
# .venv/gql-sdist), run with gql's transport, then with ApiKeyTransport and OAuth2Transport
# in its place: fails unless ours pass every test gql's passes. About 10 s.
# The behaviour suite written on aiohttp, run on the httpx stack too (asyncio): a test of
# one stack's own behaviour is marked stacks(...) and left out (tests/README.md). Apart
# from make test, whose 4 minutes it would overrun; .ci/run runs both.
test-stacks: $(STAMP)
	GQL_SERVICE_AUTH_STACKS=httpx,requests,httpxsync,trio $(BIN)/python -m pytest \
		-n $(PYTEST_WORKERS) --dist loadgroup -p no:randomly

# bench.py's tiny run proves make bench's script reports every figure: about two minutes
# (1 min 45 s alone here), so apart from make test too; .ci/run runs it.
test-bench: $(STAMP)
	GQL_SERVICE_AUTH_BENCH=1 $(BIN)/python -m pytest tests/test_bench.py -p no:randomly

gql-suite: $(STAMP)
	$(BIN)/python tests/gql_suite/run.py

test: lint typecheck gql-suite pytest

demo: $(STAMP)
	$(BIN)/gql-service-auth demo

# About 60 s, not part of make test: 50 workers, 1 s tokens, figures printed.
soak: $(STAMP)
	$(BIN)/python benchmarks/soak.py --seconds 60

BENCH_STAMP := $(VENV)/.installed-bench

$(BENCH_STAMP): pyproject.toml $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	touch $(BENCH_STAMP)

# About two minutes; prints figures, never fails on a timing.
bench: $(BENCH_STAMP)
	$(BIN)/python benchmarks/bench.py

DOCS_STAMP := $(VENV)/.installed-docs

$(DOCS_STAMP): pyproject.toml $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,docs]'
	touch $(DOCS_STAMP)

# The site, into docs/_build/html: every warning is an error, every public name must be in
# the reference, and no variable of the build's environment may show in a page (a canary
# is set to catch one). Open docs/_build/html/index.html.
docs: $(DOCS_STAMP)
	GSA_DOCS_CANARY=docs-canary-8d1f0c $(BIN)/sphinx-build -E -q -W --keep-going -b html docs docs/_build/html
	$(BIN)/python docs/check_reference.py docs/_build/html docs-canary-8d1f0c

# The home page, the API reference and the architecture page as a reader sees them, in
# headless Chromium (installed with apt-get as root if missing): PNGs in
# docs/_build/screenshots. Look at them after changing the docs.
docs-screenshots: docs
	bash docs/screenshots.sh docs/_build/html docs/_build/screenshots

# The suite on every other Python 3.10-3.14 the machine has (absent ones are skipped), by
# nox; make test runs it on the default one.
matrix: $(STAMP)
	$(BIN)/nox

# An unpacked sdist must pass on its own: build it, unpack it, lint, type-check and run
# gql's suite there, then the matrix from it (the suite on every other Python the machine
# has, or on this one when it has none). make test has run the suite on this Python from
# the work tree; what the sdist's run proves is its files, which any Python proves, so the
# matrix runs once, from the sdist, rather than after a run of the suite there too.
SDIST_DIR := $(VENV)/sdist-check

sdist-check: $(STAMP)
	rm -rf $(SDIST_DIR)
	$(BIN)/python -m build --sdist --outdir $(SDIST_DIR) .
	tar -xzf $(SDIST_DIR)/*.tar.gz -C $(SDIST_DIR)
	GQL_SERVICE_AUTH_MATRIX_OR_DEFAULT=1 $(MAKE) -C $(SDIST_DIR)/gql_service_auth-*/ \
		lint typecheck gql-suite matrix PYTHON=$(PYTHON)

examples: $(STAMP)
	@for script in examples/*.py; do echo "== $$script"; $(BIN)/python $$script || exit 1; done

clean:
	rm -rf $(VENV) .nox .coverage .mypy_cache .pytest_cache .ruff_cache
