# Two commands for a fresh machine: `make demo` and `make test`. Both create .venv and install
# the project (with its dev extras) from pyproject.toml; nothing needs to be installed by hand.
# pip does not byte-compile what it installs (--no-compile): compiling every module of PySpark,
# numpy and the rest took a third of the install, and Python compiles what is imported anyway.
# `make check` is the inner loop: `make lint` and the tests that start no process.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: test check lint typecheck demo bench bench-quick chaos compat lock clean \
	monitoring promtool chromium console-screenshots

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "tickwheel needs Python >= 3.11")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-compile -e '.[dev]'
	@touch $@

lint: $(STAMP) typecheck
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

# mypy (strict) on the packages listed in pyproject.toml, seen as tickwheel/<package>.
TYPECHECK := build/typecheck/tickwheel
typecheck: $(STAMP)
	@mkdir -p $(TYPECHECK)
	@for package in common wheel replication node harness chaos cli client console audit; do ln -sfn ../../../$$package $(TYPECHECK)/$$package; done
	@ln -sfn ../../generated/tickwheel/v1 $(TYPECHECK)/v1
	@ln -sfn ../../generated/tickwheel/rocketmq $(TYPECHECK)/rocketmq
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy deploy/monitoring

# The tests run on parallel workers (pytest-xdist), a file's tests on one worker (so that a
# module's cluster starts once), files handed out in the order tests/conftest.py sets; each
# worker picks ports from a range of its own. Three on two cores: most tests wait on their
# nodes (timers, the network), and what takes the CPU for minutes without counting seconds
# (Spark's JVMs, the simulation) runs at a lower priority (in_background in tests/conftest.py).
# The tests start hundreds of Python processes (nodes, the CLI, the chaos runner), and where
# PYTHONDONTWRITEBYTECODE is set each would compile tickwheel's 120-odd modules again: a node
# then takes 1.1 s of CPU to start instead of 0.7 s. Their bytecode is cached in build/pycache
# instead, out of the source folders, whatever that variable says. The slowest tests are
# listed at the end (--durations), to see where the suite's minutes go.
WORKERS ?= 3
PYCACHE := PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=$(CURDIR)/build/pycache
PYTEST  := $(PYCACHE) $(PY) -m pytest -n $(WORKERS) --dist loadfile --no-loadscope-reorder \
	--durations=15

test: lint promtool chromium
	$(PYTEST)

# What starts no process: no node, CLI, JVM or client subprocess (those tests are marked cluster).
check: lint
	$(PYTEST) -m "not cluster"

# promtool (the alert rules' unit tests) and the prometheus server (the cluster test that runs
# every dashboard query and alert expression against real nodes) come from Debian's prometheus
# package (2.42 in bookworm), installed when promtool is missing: as root (CI on a fresh
# machine) or through sudo.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
promtool:
	@command -v promtool > /dev/null || { $(SUDO) apt-get update -qq && \
	    $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	        --no-install-recommends prometheus; }

# The console's browser tests (tests/console) drive Debian's chromium through Playwright,
# pointed at /usr/bin/chromium: installed here when missing (as root, or through sudo), never
# downloaded by Playwright at run time.
chromium:
	@test -x /usr/bin/chromium || { $(SUDO) apt-get update -qq && \
	    $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	        --no-install-recommends chromium; }

# The screenshots of docs/console.md, taken by the browser tests on a real cluster.
console-screenshots: $(STAMP) chromium
	TICKWHEEL_SCREENSHOTS=docs/console $(PYCACHE) $(PY) -m pytest -n0 tests/console/test_browser.py

# The dashboards (deploy/grafana, and their ConfigMap) and the alert rules (the rules file and
# the PrometheusRule) from deploy/monitoring: run after changing it, and commit what it writes.
monitoring: $(STAMP)
	PYTHONPATH=deploy $(PY) -m monitoring.generate

demo: $(STAMP)
	$(PY) -m tickwheel.harness.demo

bench: $(STAMP)
	$(PY) -m tickwheel.harness.wheel_bench --json
	$(PY) -m tickwheel.harness.replication_bench --json
	$(PY) -m tickwheel.harness.node_bench --json

bench-quick: $(STAMP)
	$(PY) -m tickwheel.harness.wheel_bench --json --quick
	$(PY) -m tickwheel.harness.replication_bench --json --quick
	$(PY) -m tickwheel.harness.node_bench --json --quick

# RocketMQ 5's official clients, unchanged, against a 3-node cluster (tests/rocketmq): the Python
# client as in `make test`, and the Node.js client installed from its package-lock.json by npm ci
# when node and npm are on the machine; without them it says so and runs the Python client alone.
COMPAT_NODE := tests/rocketmq/node
compat: $(STAMP)
	@set -e; clients=python; \
	if command -v node > /dev/null && command -v npm > /dev/null; then \
	    echo "compat: the Python and the Node.js clients (node $$(node --version))"; \
	    npm ci --prefix $(COMPAT_NODE) --no-audit --no-fund --loglevel=error; \
	    clients=python,node; \
	else \
	    echo "compat: node or npm is not installed, so the Node.js client is NOT run;" \
	         "running the Python client alone"; \
	fi; \
	TICKWHEEL_COMPAT=$$clients $(PY) -m pytest tests/rocketmq/test_official_client.py

# The long chaos run: 10 minutes, every fault, then the audit (report in chaos-out/audit/);
# `make chaos CHAOS_SHARDS=2` runs it on two shards.
CHAOS_OUT ?= chaos-out
CHAOS_SHARDS ?= 1
chaos: $(STAMP)
	rm -rf $(CHAOS_OUT)
	$(PY) -m tickwheel.chaos run --out $(CHAOS_OUT) --duration 600 --rate 300 --faults all \
	    --shards $(CHAOS_SHARDS)
	$(PY) -m tickwheel.chaos.audit $(CHAOS_OUT)

# The hashed lock files that deploy/Dockerfile installs from with pip --require-hashes, resolved
# by uv (a dev dependency) for CPython 3.11 on Linux (the image's Debian 12: glibc 2.36):
#   requirements.lock        the node's dependencies ([project] dependencies), the node image
#   requirements-audit.lock  the same plus the audit extra, held to the same versions (-c)
#   requirements-build.lock  what builds the wheel and generates its gRPC stubs (build-system)
# Each pin lists the hashes of every file of its version, so one file serves x86_64 and aarch64;
# the aarch64 resolution is made too and must pin the same versions with the same hashes.
# Pins already in the files are kept; `make lock LOCK_ARGS=--upgrade` takes the newest allowed.
LOCKS      := requirements.lock requirements-audit.lock requirements-build.lock
LOCK_TMP   := build/lock
LOCK_ARGS  ?=
UV_COMPILE  = $(VENV)/bin/uv pip compile --quiet --generate-hashes --python-version 3.11 \
              --custom-compile-command 'make lock' $(LOCK_ARGS)
# $(call compile-locks,PLATFORM,DIR): the three files for one platform, written into DIR.
define compile-locks
	$(UV_COMPILE) --python-platform $(1) pyproject.toml -o $(2)requirements.lock
	$(UV_COMPILE) --python-platform $(1) pyproject.toml --extra audit \
	    -c $(2)requirements.lock -o $(2)requirements-audit.lock
	$(UV_COMPILE) --python-platform $(1) $(LOCK_TMP)/build-system.in -o $(2)requirements-build.lock
endef
lock: $(STAMP)
	@rm -rf $(LOCK_TMP) && mkdir -p $(LOCK_TMP)/aarch64
	$(PY) -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"], sep="\n")' > $(LOCK_TMP)/build-system.in
	$(call compile-locks,x86_64-manylinux_2_36,)
	cp $(LOCKS) $(LOCK_TMP)/aarch64/
	$(call compile-locks,aarch64-manylinux_2_36,$(LOCK_TMP)/aarch64/)
	@for lock in $(LOCKS); do \
	    sed '/^ *#/d' $$lock > $(LOCK_TMP)/x86_64.pins; \
	    sed '/^ *#/d' $(LOCK_TMP)/aarch64/$$lock > $(LOCK_TMP)/aarch64.pins; \
	    diff -u $(LOCK_TMP)/x86_64.pins $(LOCK_TMP)/aarch64.pins \
	        || { echo "$$lock: aarch64 resolves differently from x86_64" >&2; exit 1; }; \
	done

clean:
	rm -rf $(VENV) build .pytest_cache .ruff_cache .hypothesis *.egg-info chaos-out $(COMPAT_NODE)/node_modules
