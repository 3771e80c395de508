# The README's commands. `make run` starts everything on the embedded default
# (bundled Redis server + SQLite); `make test` runs the whole suite.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PORT   ?= 8000

.PHONY: install run test lint bench chaos screenshots clean

$(BIN)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is required"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,bench]'
	@touch $@

install: $(BIN)/.installed

run: install
	$(BIN)/skilljobs up --port $(PORT)

test: install
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/pytest -q -ra $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff format --check jobs chains delivery dashboard tests bench
	$(BIN)/ruff check jobs chains delivery dashboard tests bench
	$(BIN)/mypy

bench: install
	$(BIN)/python -m bench.run_all

# Faults under load (kill -9, SIGTERM, Redis and PostgreSQL restarts, pool exhaustion, a
# stalled worker) against a private PostgreSQL cluster and Redis; the table is appended to
# bench/RESULTS.md and the exit status is non-zero when a must-be-0 figure is not 0.
chaos: install
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m bench.chaos $(CHAOS_ARGS)

# The README's dashboard screenshots, refreshed on purpose (tests save theirs to a temp dir):
# the browser tests in headless Chromium, told to write into docs/.
screenshots: install
	DASHBOARD_SCREENSHOT_DIR="$(CURDIR)/docs" PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/pytest -q \
		tests/dashboard/test_browser.py tests/dashboard/test_browser_pages.py

clean:
	rm -rf $(VENV) .skilljobs .pytest_cache
