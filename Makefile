# Lazaretto developer tasks. `make help` lists them.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.ONESHELL:
.DEFAULT_GOAL := help

PORT ?= 8000
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SERVICES := bash scripts/services.sh
BOOTSTRAP_PYTHON := $(shell command -v python3.11 2>/dev/null || command -v python3 2>/dev/null)

# Source var/services.env (written by `scripts/services.sh start`) while keeping
# any DATABASE_URL / CELERY_BROKER_URL the caller set: the caller always wins,
# even over a stale var/services.env from an earlier run. These targets are
# local runs: var/services.env itself turns DEBUG on (so the settings use their
# local-only key) when the caller gives neither SECRET_KEY nor DEBUG.
define load_env
_caller_db="$${DATABASE_URL:-}"; _caller_broker="$${CELERY_BROKER_URL:-}"
if [ -f var/services.env ]; then . var/services.env; fi
if [ -n "$$_caller_db" ]; then export DATABASE_URL="$$_caller_db"; fi
if [ -n "$$_caller_broker" ]; then export CELERY_BROKER_URL="$$_caller_broker"; fi
endef

# mypy's Django plugin imports the settings, which need a DATABASE_URL (never
# connected to) and a SECRET_KEY (never used): `make lint` works without
# services, so without var/services.env.
define lint_env
$(load_env)
if [ -z "$${DATABASE_URL:-}" ]; then export DATABASE_URL=postgres://lint:lint@127.0.0.1:5432/lint; fi
if [ -z "$${SECRET_KEY:-}" ]; then export SECRET_KEY=lint-only-never-used; fi
endef

# The test database's durability profile, for pytest only (tests/conftest.py):
# fast turns synchronous_commit off on pytest-django's test database; durable
# changes nothing. The cluster and `make run`'s database are always durable.
LAZARETTO_TEST_DB_PROFILE ?= fast
# pytest-xdist workers: the suite runs on this many processes, a test file
# at a time on each (--dist loadfile), each with its own test database.
# Three for the whole suite: a fourth took the fuzzer's share of the two
# cores, the longest test, from 235 s to 422 s. Four for the fast tier,
# whose tests wait on the processes they start more than they compute.
PYTEST_WORKERS ?= 3
PYTEST_FAST_WORKERS ?= 4
# bench-soak's delivered_retention for every queue it makes: full, headers or none.
RETENTION ?= full

.PHONY: help venv services stop test test-fast run run-ha lint fmt fuzz bench bench-peers bench-soak clean

help:
	@echo "make venv      create .venv and install requirements-dev.txt (only when it changed)"
	echo "make services  start project-local PostgreSQL + Redis (scripts/services.sh start)"
	echo "make stop      stop them"
	echo "make test      ruff check, ruff format --check, mypy, every test on $(PYTEST_WORKERS) workers"
	echo "make test-fast ruff, and the tests that need no HA pair, fuzzer, Spark or browser, on $(PYTEST_FAST_WORKERS) workers (the inner loop)"
	echo "make run       migrate, load demo data, serve the console on 127.0.0.1:\$$PORT (PORT=$(PORT)); Spark jobs on a local Spark Connect server (SPARK_CONNECT_PORT)"
	echo "make run-ha    the same with an HA pair: two broker nodes, a second PostgreSQL cluster"
	echo "make lint      ruff check + ruff format --check + mypy"
	echo "make fmt       ruff format + ruff check --fix"
	echo "make fuzz      the REST API fuzzed from outside by schemathesis for FUZZ_SECONDS (240)"
	echo "make bench     run every bench (python -m bench.NAME) but the long peers and soak runs"
	echo "make bench-peers  each retention mode beside PGMQ (archive, delete) and PgQueuer; Procrastinate, Celery alone, the bare loop"
	echo "make bench-soak   ten minutes at 70 % of the drain rate, then an idle transaction and the recovery"
	echo "                  (RETENTION=full|headers|none: what its queues keep of a delivered message; full)"
	echo "make clean     stop services and remove var/"

venv: $(STAMP)

# pip's "WARNING: Location ... is ignored" lines (local index config on this
# machine) are dropped from stderr; everything else and pip's exit code are kept.
$(STAMP): requirements.txt requirements-dev.txt
	@if [ ! -x "$(PY)" ]; then
	  [ -n "$(BOOTSTRAP_PYTHON)" ] || { echo "make: neither python3.11 nor python3 found" >&2; exit 1; }
	  echo "creating $(VENV) with $(BOOTSTRAP_PYTHON)"
	  "$(BOOTSTRAP_PYTHON)" -m venv "$(VENV)"
	fi
	echo "installing requirements-dev.txt (requirements.txt and the test tools) into $(VENV)"
	{ "$(PY)" -m pip install -q --disable-pip-version-check -r requirements-dev.txt 2>&1 1>&3 \
	  | { grep -v '^WARNING: Location' || true; } >&2; } 3>&1
	touch "$@"

services:
	@$(SERVICES) start

stop:
	@$(SERVICES) stop

# The project byte-compiled once, so that none of the hundreds of Python
# processes the suite starts compiles it again (PYTHONDONTWRITEBYTECODE would
# otherwise have each do so). The files go out to the workers heaviest tier
# first (tests/conftest.py), not pytest-xdist's most-tests-first. pytest
# keeps the test files whose asserts it rewrote in __pycache__ only where
# Python may write bytecode: with PYTHONDONTWRITEBYTECODE set, every pytest
# process would rewrite them all again, half of what collecting costs.
COMPILE := $(VENV)/bin/python -m compileall -q broker console workers demo_consumers rig tests bench
PYTEST = PYTHONDONTWRITEBYTECODE= $(VENV)/bin/pytest -n $(1) --dist loadfile --no-loadscope-reorder
# What test-fast leaves out: the tiers that need an HA pair, the fuzzer, Spark or Chromium.
FAST_TIER := not (ha or fuzz or spark or browser)

test: venv services
	@$(load_env)
	set -x
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy .
	bash scripts/browser.sh
	bash scripts/spark.sh
	bash scripts/promtool.sh
	$(COMPILE)
	LAZARETTO_TEST_DB_PROFILE=$(LAZARETTO_TEST_DB_PROFILE) $(call PYTEST,$(PYTEST_WORKERS)) --durations=10

test-fast: venv services
	@$(load_env)
	set -x
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	bash scripts/promtool.sh
	$(COMPILE)
	LAZARETTO_TEST_DB_PROFILE=$(LAZARETTO_TEST_DB_PROFILE) $(call PYTEST,$(PYTEST_FAST_WORKERS)) -m "$(FAST_TIER)"

lint: venv
	@$(lint_env)
	set -x
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy .

fmt: venv
	@set -x
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# run-ha is the same with an HA pair of broker nodes on this machine: node A
# owns the project cluster, node B clones a second one (scripts/run-ha.sh).
run run-ha: venv services
	@$(load_env)
	export PORT="$(PORT)"
	# The demo's handlers (demo_consumers), unless the caller names modules.
	export LAZARETTO_CONSUMER_MODULES="$${LAZARETTO_CONSUMER_MODULES:-demo_consumers}"
	set -x
	bash scripts/spark.sh
	$(PY) manage.py migrate --noinput
	$(PY) manage.py demo
	exec scripts/$@.sh

# The REST API fuzzed from outside for FUZZ_SECONDS (240 by default):
# schemathesis, every phase and check, against gunicorn (scripts/fuzz.sh).
fuzz: venv services
	@$(load_env)
	set -x
	bash scripts/fuzz.sh

bench: venv services
	@$(load_env)
	shopt -s nullglob
	for f in bench/*.py; do
	  name=$$(basename "$$f" .py)
	  case "$$name" in __init__|_*|peers|soak) continue ;; esac
	  echo "== bench.$$name"
	  $(PY) -m "bench.$$name"
	done

bench-peers: venv services
	@$(load_env)
	$(PY) -m bench.peers

bench-soak: venv services
	@$(load_env)
	$(PY) -m bench.soak --retention "$(RETENTION)"

clean:
	@$(SERVICES) stop
	$(SERVICES) purge
