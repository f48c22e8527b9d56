# oarlock: `make serve` runs the relay, `make test` runs every check. Both set up what they need.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
SUDO ?= $(shell [ "$$(id -u)" = 0 ] || echo sudo)
HOST ?= 127.0.0.1
PORT ?= 8000
DATA ?= ./data

include tools.mk

.PHONY: serve migrate test lint format bench reliability load clean chromium

N ?= 100

$(PY):
	$(PYTHON) -m venv $(VENV)

# Reinstall only when pyproject.toml changes.
# Not quiet: the first install takes minutes (claude-agent-sdk ships the claude CLI), and a
# silent make looks stuck. pip shows each package and a progress bar.
$(VENV)/.installed: pyproject.toml | $(PY)
	@echo "Installing oarlock and its dependencies into $(VENV) (the first time takes a few minutes)…"
	$(PIP) install -q --upgrade pip
	$(PIP) install --progress-bar on -e .
	@echo "Installed. Starting oarlock: it prints its URL once it answers."
	touch $@

$(VENV)/.installed-test: pyproject.toml $(VENV)/.installed
	$(PIP) install -q -e '.[test]'
	touch $@

serve: $(VENV)/.installed
	$(PY) -m app migrate --data-dir $(DATA)
	$(PY) -m app serve --host $(HOST) --port $(PORT) --data-dir $(DATA)

migrate: $(VENV)/.installed
	$(PY) -m app migrate --data-dir $(DATA)

# Debian's Chromium for the browser tests (Playwright never downloads a browser here).
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
		$(SUDO) apt-get update -qq && \
		$(SUDO) apt-get install -y -qq --no-install-recommends chromium fonts-liberation >/dev/null; }
	@command -v chromium >/dev/null 2>&1 || { echo "chromium is missing" >&2; exit 1; }

lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check app tests bench alembic/env.py
	$(VENV)/bin/ruff format --check app tests bench alembic/env.py

format: $(VENV)/.installed-test
	$(VENV)/bin/ruff format app tests bench alembic/env.py
	$(VENV)/bin/ruff check --fix app tests bench alembic/env.py

# Browser tests run in their own pytest process: Playwright's sync API keeps an event loop
# running that the asyncio tests after it could not start theirs in.
test: $(VENV)/.installed-test chromium copilot-cli lint
	$(VENV)/bin/pytest -q -p no:cacheprovider --ignore-glob="tests/test_browser*.py"
	$(VENV)/bin/pytest -q -p no:cacheprovider tests/test_browser*.py

bench: $(VENV)/.installed-test
	$(PY) -m bench

# 100 connections over 20 conversations with streaming agents for 5 minutes (DURATION=…)
DURATION ?= 300
load: $(VENV)/.installed-test
	$(PY) -m bench.load --seconds $(DURATION)

# Kill the relay with SIGKILL N times under load; prints kills=… lost=0 duplicated=0 …
reliability: $(VENV)/.installed-test
	$(PY) -m bench.reliability --kills $(N)

clean:
	rm -rf $(VENV) .pytest_cache
