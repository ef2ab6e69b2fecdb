# The two commands a new user needs: `make demo` and `make test`.
# Each sets up everything it needs itself: the virtualenv, the packages, the Kafka jars
# (via Maven) and PostgreSQL (via apt when missing); `make test` also Debian's chromium
# and docker-compose for the tests (via apt when missing; says so and carries on when
# it cannot install them).

PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEVSTACK := $(PY) scripts/devstack.py
PYTEST_ARGS ?=
# The suite runs on two pytest-xdist workers: its tests mostly wait on the servers
# (group joins, SIGKILLed processes recovering), so two share one Postgres and one Kafka
# well: on a 2-core machine the suite took 9.4 minutes against 15.8 serially. Each test
# has its own schema and topics (tests/conftest.py), so the workers never see each other.
PYTEST_WORKERS ?= 2
# The tests of a sharded store need Postgres clusters of their own (tests/conftest.py,
# pg_shard_databases): the suite runs with three, the first as always (each session's
# control database and single-store tests) and two for the shards, on ports 10 and 20
# above SAGA_DEV_PG_PORT (scripts/devstack.py). `make up`, `make demo` start one.
TEST_PG_CLUSTERS ?= 3

.PHONY: help venv up down status env tools test lint typecheck pytest demo demo-shards demo-up bench bench-shards bench-shard-move clean distclean

help:
	@echo "make demo    run the end-to-end demo on real Postgres and Kafka"
	@echo "make demo-shards the same on two shards, a range moved while it runs"
	@echo "make demo-up start the engine and the demo services and leave them running (Ctrl-C)"
	@echo "make test    lint, type-check and run the whole test suite on real servers"
	@echo "make up      start Postgres and Kafka (idempotent) and print SAGA_* settings"
	@echo "make down    stop what 'make up' started"

venv: $(STAMP)

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found; Python 3.11 is required" >&2; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "setup: installing saga-engine and its dev extras into $(VENV) (log: $(VENV)/pip.log)" >&2
	@$(PY) -m pip install --disable-pip-version-check --upgrade pip > $(VENV)/pip.log 2>&1 || { tail -20 $(VENV)/pip.log; exit 1; }
	@$(PY) -m pip install --disable-pip-version-check -e '.[dev]' >> $(VENV)/pip.log 2>&1 || { tail -20 $(VENV)/pip.log; exit 1; }
	@# A broken requirement (e.g. an OpenTelemetry package out of its lockstep set) fails here.
	@$(PY) -m pip check --disable-pip-version-check >> $(VENV)/pip.log 2>&1 || { tail -20 $(VENV)/pip.log; exit 1; }
	@touch $(STAMP)

up: venv
	@$(DEVSTACK) up

down: venv
	@$(DEVSTACK) down

status: venv
	@$(DEVSTACK) status

env: venv
	@$(DEVSTACK) env

# Debian's chromium and docker-compose for the tests, via apt when missing (as root or
# with passwordless sudo); when it cannot, one line says why and the tests run anyway.
tools: venv
	@$(DEVSTACK) tools

lint: venv
	@$(VENV)/bin/ruff check .
	@$(VENV)/bin/ruff format --check .
	@$(VENV)/bin/lint-imports --no-cache

typecheck: venv
	@$(VENV)/bin/mypy

test: venv lint typecheck
	@$(DEVSTACK) tools
	@SAGA_DEV_PG_CLUSTERS=$(TEST_PG_CLUSTERS) $(DEVSTACK) run -- $(PY) -m pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

pytest: venv
	@$(DEVSTACK) tools
	@SAGA_DEV_PG_CLUSTERS=$(TEST_PG_CLUSTERS) $(DEVSTACK) run -- $(PY) -m pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

# The narrated checkout scenario: starts the stack if needed, the engine and the five
# services, runs every scenario, stops what it started; exits 0 only if all held.
demo: venv
	@$(DEVSTACK) run -- $(PY) -m services_demo.scenario

# The same scenario with the engine's store on two shards (a second Postgres cluster),
# and a range of inbox partitions moved while it runs.
demo-shards: venv
	@SAGA_DEV_PG_CLUSTERS=2 $(DEVSTACK) run -- $(PY) -m services_demo.scenario --shards

# The same services, left running for you to explore (Postgres and Kafka stay up after
# Ctrl-C: `make down` stops them).
demo-up: venv
	@$(DEVSTACK) up
	@eval "$$($(DEVSTACK) env)" && exec $(PY) -m services_demo.run

# The benchmark also measures its peer, DBOS Transact (the bench extra, part of dev).
bench: venv
	@$(DEVSTACK) run -- $(PY) -m bench.e2e $(BENCH_ARGS)

# One Postgres cluster against two (a sharded store), on a second cluster of the stack.
bench-shards: venv
	@SAGA_DEV_PG_CLUSTERS=2 $(DEVSTACK) run -- $(PY) -m bench.shards $(BENCH_ARGS)

# The move of a range of 100,000 sagas from one cluster to another (saga shard move).
bench-shard-move: venv
	@SAGA_DEV_PG_CLUSTERS=2 $(DEVSTACK) run -- $(PY) -m bench.shard_move $(BENCH_ARGS)

clean:
	rm -rf .pytest_cache .mypy_cache .ruff_cache .hypothesis

distclean: down clean
	rm -rf $(VENV) .dev
