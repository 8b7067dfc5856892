# Two commands set everything up on a fresh machine: `make up` and `make test`.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STRATA := $(VENV)/bin/strata
DATA_DIR ?= .strata
PYTEST_ARGS ?=

.PHONY: setup up down status test lint unit integration system bench soak load clean

setup:
	@bash scripts/setup.sh

up: setup
	@$(STRATA) up --data-dir $(DATA_DIR)

down:
	@$(STRATA) down --data-dir $(DATA_DIR)

status:
	@$(STRATA) status --data-dir $(DATA_DIR)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-logo

# Three worker processes, each running whole modules (--dist loadfile keeps a module's
# fixtures, its ZooKeeper, brokers and SparkSession, on one worker). On 2026-11-30 a run
# kept both cores 99-100 % busy from start to end (brokers, Spark JVMs and PySpark's
# Python workers the most), so more workers do not help (four were not faster than three
# in that day's runs, which were hours apart). Short-lived JVMs run with the client
# compiler only (tests/conftest.py: SPARK_SUBMIT_OPTS, SERVER_JVMFLAGS,
# SPARK_LAUNCHER_OPTS): measured one JVM at a time, a Spark session's CPU about halves
# and a ZooKeeper's drops by a third.
# The modules go out
# longest first, in tests/conftest.py's order (--no-loadscope-reorder: xdist would
# otherwise sort them by number of tests, which starts the longest, one-test modules
# last and leaves the other workers idle while they run). TEST_WORKERS=0 runs in this
# process. --tb=short: a failure shows its line and message, not the whole test's source
# (CI shows the head and tail of the output; long tracebacks pushed failures' messages
# out of it).
TEST_WORKERS ?= 3

test: setup lint
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 --tb=short $(PYTEST_ARGS)

# The tiers (each test module declares one, `pytestmark = pytest.mark.unit`, and
# tests/conftest.py fails the collection of a module that does not): unit is pure
# logic with no ZooKeeper, broker, Spark or HTTP process (under a minute on two cores);
# integration starts real ZooKeeper, broker and gateway processes; system runs the
# faults and nemeses, Spark and Delta end to end, whole stacks and the benchmarks'
# smoke runs.
# `make test` runs all three.
unit: setup
	$(PY) -m pytest -m unit $(PYTEST_ARGS)

integration: setup
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m integration $(PYTEST_ARGS)

system: setup
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m system $(PYTEST_ARGS)

bench: setup
	@bash scripts/bench.sh

# The fault tests as a soak: each replication scenario (tests/test_faults.py) keeps
# injecting its fault, the network nemesis (tests/test_network_partitions.py) keeps
# cutting links, and the consumer group nemesis (tests/test_group_faults.py) keeps
# running rounds of its faults, and the transaction nemesis (tests/test_txn_faults.py)
# keeps killing coordinators, leaders and writers, for SOAK_SECONDS (per test) before
# the checker runs. STRATA_SEED=N / STRATA_NET_SEED=N / STRATA_TXN_SEED=N replay the
# printed random schedules.
SOAK_SECONDS ?= 300
soak: setup
	STRATA_SOAK_SECONDS=$(SOAK_SECONDS) $(PY) -m pytest tests/test_faults.py tests/test_network_partitions.py tests/test_group_faults.py tests/test_txn_faults.py -p no:cacheprovider -s $(PYTEST_ARGS)

# Headless locust against the `make up` stack's gateway (scripts/load.sh, load_tests/README.md):
# LOAD_SECONDS, LOAD_USERS, LOAD_CLASSES; GATEWAY_URL / GATEWAY_TOKEN override `strata status`.
LOAD_SECONDS ?= 60
LOAD_USERS ?= 20
load: setup
	@DATA_DIR=$(DATA_DIR) LOAD_SECONDS=$(LOAD_SECONDS) LOAD_USERS=$(LOAD_USERS) bash scripts/load.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
