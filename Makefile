# The README's commands. `make run` starts everything on the embedded default
# (bundled Redis server + SQLite); `make test` runs the whole suite.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PORT   ?= 8000

.PHONY: install install-test run test test-fast lint bench chaos screenshots clean

# Three installs, each only what its command needs: `make run` the runtime, `make test` /
# `make lint` the test tools (+ the peer queues of the benchmark tests), `make bench` the
# same. pip's and setuptools' output goes to a log that is shown only when a step fails.
INSTALL_LOG := $(VENV)/install.log
define pip_step
	@echo "==> $(1)"
	@$(BIN)/pip install -q $(2) >>$(INSTALL_LOG) 2>&1 || { cat $(INSTALL_LOG); exit 1; }
endef

$(BIN)/python:
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is required"'
	@echo "==> creating the virtualenv in $(VENV)"
	@$(PYTHON) -m venv $(VENV)
	$(call pip_step,upgrading pip,--upgrade pip)

$(BIN)/.installed-run: pyproject.toml | $(BIN)/python
	$(call pip_step,installing skilljobs (runtime only),-e .)
	@touch $@

TEST_INSTALL := -e '.[test,bench]'  # a variable: a comma in $(call ...) splits arguments
$(BIN)/.installed-test: pyproject.toml | $(BIN)/python
	$(call pip_step,installing skilljobs with the test tools,$(TEST_INSTALL))
	@touch $@ $(BIN)/.installed-run

install: $(BIN)/.installed-run
install-test: $(BIN)/.installed-test

run: install
	@echo "==> starting skilljobs up on port $(PORT)"
	@$(BIN)/skilljobs up --port $(PORT)

# The whole suite across the cores (pytest-xdist; XDIST=0 runs it in one process). The 25
# slowest tests and any test that was rerun (only those marked flaky may be) are listed at
# the end.
#
# Bytecode caches are written even where the environment turns them off
# (PYTHONDONTWRITEBYTECODE): the suite starts a few hundred Python processes (workers, the
# CLI, web servers) that would otherwise each compile the packages again, and every pytest
# worker would rewrite every test file's asserts. The packages are compiled once up front,
# so that the pytest workers starting together do not each compile them.
XDIST ?= 4
WITH_BYTECODE := PYTHONDONTWRITEBYTECODE=
PACKAGES := jobs chains delivery dashboard bench
test: install-test
	@$(WITH_BYTECODE) $(BIN)/python -m compileall -q $(PACKAGES) >/dev/null
	$(WITH_BYTECODE) PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/pytest -q -ra -n $(XDIST) \
		--dist worksteal --durations=25 $(PYTEST_ARGS)

# The tier to run after every change (about a minute): pure logic and the contract tests on
# SQLite; nothing marked integration-only, slow, browser, chaos, network or PostgreSQL.
FAST_MARKERS := not slow and not browser and not chaos and not network and not postgres
test-fast: install-test
	@$(WITH_BYTECODE) $(BIN)/python -m compileall -q $(PACKAGES) >/dev/null
	$(WITH_BYTECODE) PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/pytest -q -n 2 -m "$(FAST_MARKERS)" \
		$(PYTEST_ARGS)

lint: install-test
	PYTHON=$(BIN)/python bash .ci/commit-msgs
	$(BIN)/ruff format --check jobs chains delivery dashboard tests bench
	$(BIN)/ruff check jobs chains delivery dashboard tests bench
	$(BIN)/mypy

bench: install-test
	$(BIN)/python -m bench.run_all

# Faults under load (kill -9, SIGTERM, Redis and PostgreSQL restarts, pool exhaustion, a
# stalled worker) against a private PostgreSQL cluster and Redis; the table is appended to
# bench/RESULTS.md and the exit status is non-zero when a must-be-0 figure is not 0.
chaos: install-test
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m bench.chaos $(CHAOS_ARGS)

# The README's dashboard screenshots, refreshed on purpose (tests save theirs to a temp dir):
# the browser tests in headless Chromium, told to write into docs/.
screenshots: install-test
	DASHBOARD_SCREENSHOT_DIR="$(CURDIR)/docs" PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/pytest -q \
		tests/dashboard/test_browser.py tests/dashboard/test_browser_pages.py

clean:
	rm -rf $(VENV) .skilljobs .pytest_cache
