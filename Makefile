# oarlock: `make serve` runs the relay, `make test` runs every check. Both set up what they need.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
SUDO ?= $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# `make serve HOST=… PORT=… DATA=…` on make's command line, else oarlock's own variables
# (OARLOCK_HOST, OARLOCK_PORT, OARLOCK_DATA_DIR: `oarlock serve` reads them too). A plain
# HOST, PORT or DATA in the environment, set for some other program, is not taken.
ifneq ($(origin HOST),command line)
HOST := $(or $(OARLOCK_HOST),127.0.0.1)
endif
ifneq ($(origin PORT),command line)
PORT := $(or $(OARLOCK_PORT),8000)
endif
ifneq ($(origin DATA),command line)
DATA := $(or $(OARLOCK_DATA_DIR),./data)
endif

include tools.mk

.PHONY: serve migrate test lint format bench reliability load clean chromium postgresql redis

N ?= 100
PROVIDER ?= demo

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

# Debian's PostgreSQL server binaries for the tests' throwaway server (tests/postgres.py): no
# system service. The drop-in stops the package from creating (and starting) a default cluster.
postgresql:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
		$(SUDO) mkdir -p /etc/postgresql-common/createcluster.d && \
		echo "create_main_cluster = false" | \
			$(SUDO) tee /etc/postgresql-common/createcluster.d/oarlock-no-main.conf >/dev/null && \
		$(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -qq --no-install-recommends postgresql >/dev/null && \
		{ pg_lsclusters --no-header 2>/dev/null | awk '$$4 == "online" {print $$1, $$2}' | \
			while read -r version cluster; do $(SUDO) pg_ctlcluster "$$version" "$$cluster" stop; \
			done; }; }
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { echo "postgresql is missing" >&2; exit 1; }

# Debian's Redis server binary for the cluster tests' throwaway server (tests/redis.py): no
# system service. Where the package started one (a machine with systemd), it is stopped and
# disabled: the tests start their own on a loopback port.
redis:
	@command -v redis-server >/dev/null 2>&1 || { \
		$(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -qq --no-install-recommends redis-server >/dev/null && \
		{ $(SUDO) systemctl disable --now redis-server >/dev/null 2>&1 || \
			$(SUDO) service redis-server stop >/dev/null 2>&1 || true; }; }
	@command -v redis-server >/dev/null 2>&1 || { echo "redis-server is missing" >&2; exit 1; }

# Run a second time against PostgreSQL: the storage (and its threads), migration, API (HTTP,
# WebSocket, schema fuzz), supervisor, reliability, import, search, archive and steer tests and
# tests/test_postgres.py, on a server the run starts and stops itself (tests/postgres.py).
POSTGRES_TESTS := tests/test_store.py tests/test_migrations.py tests/test_api.py tests/test_ws.py \
	tests/test_schema_fuzz.py tests/test_supervisor.py tests/test_reliability.py \
	tests/test_postgres.py tests/test_import.py tests/test_import_hostile.py tests/test_search.py \
	tests/test_archive.py \
	tests/test_archive_relay.py tests/test_steer_api.py tests/test_steer_store.py \
	tests/test_overhead_store.py tests/test_waiting.py tests/test_attachments.py \
	tests/test_get_routes.py tests/test_storage_thread.py

lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check app tests bench alembic/env.py
	$(VENV)/bin/ruff format --check app tests bench alembic/env.py

format: $(VENV)/.installed-test
	$(VENV)/bin/ruff format app tests bench alembic/env.py
	$(VENV)/bin/ruff check --fix app tests bench alembic/env.py

# Browser tests run in their own pytest process: Playwright's sync API keeps an event loop
# running that the asyncio tests after it could not start theirs in.
# The test relays run on tests/relay.py's CheckedLoop (a call made on the loop from another
# thread fails the test: uvloop does not check, it crashes), the PostgreSQL run on uvloop.
# Each run spreads its tests over processes (pytest-xdist; each process starts its own
# PostgreSQL and Redis): see README.md for the times. TEST_WORKERS (default: one per core) for
# the PostgreSQL and browser runs, which keep the cores busy; the first run's tests also wait
# (relays, nodes and CLIs as processes, timers), so by default it has one process more than
# the cores (2 cores: 637 s with two, 499 s with three; the other runs gained nothing).
TEST_WORKERS ?= auto
MAIN_WORKERS ?= $(if $(filter auto,$(TEST_WORKERS)),$(shell echo $$(( $$(nproc) + 1 ))),$(TEST_WORKERS))
PYTEST_ONCE := $(VENV)/bin/pytest -q -p no:cacheprovider
PYTEST := $(PYTEST_ONCE) -n $(TEST_WORKERS)
test: $(VENV)/.installed-test chromium postgresql redis copilot-cli lint
	$(PYTEST_ONCE) -n $(MAIN_WORKERS) --ignore-glob="tests/test_browser*.py"
	OARLOCK_TEST_DB=postgres OARLOCK_TEST_LOOP=uvloop $(PYTEST) $(POSTGRES_TESTS)
	$(PYTEST) tests/test_browser*.py

bench: $(VENV)/.installed-test
	$(PY) -m bench

# 100 connections over 20 conversations with streaming agents for 5 minutes (DURATION=…)
DURATION ?= 300
load: $(VENV)/.installed-test
	$(PY) -m bench.load --seconds $(DURATION)

# Kill the relay with SIGKILL N times under load (PROVIDER=demo|claude); prints kills=… unanswered=0 …
# DATABASE_URL=postgresql://…: run it on an empty PostgreSQL database instead of SQLite.
reliability: $(VENV)/.installed-test
	$(PY) -m bench.reliability --kills $(N) --provider $(PROVIDER) $(if $(DATABASE_URL),--database-url '$(DATABASE_URL)') $(if $(CLUSTER),--cluster $(CLUSTER))

clean:
	rm -rf $(VENV) .pytest_cache
