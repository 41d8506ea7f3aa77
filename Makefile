# Two commands for a fresh machine: `make demo` and `make test`. Both create .venv and install
# the project (with its dev extras) from pyproject.toml; nothing needs to be installed by hand.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: test lint typecheck demo bench bench-quick chaos clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "tickwheel needs Python >= 3.11")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $@

lint: $(STAMP) typecheck
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

# mypy (strict) on the packages listed in pyproject.toml, seen as tickwheel/<package>.
TYPECHECK := build/typecheck/tickwheel
typecheck: $(STAMP)
	@mkdir -p $(TYPECHECK)
	@for package in wheel replication node chaos client; do ln -sfn ../../../$$package $(TYPECHECK)/$$package; done
	@ln -sfn ../../generated/tickwheel/v1 $(TYPECHECK)/v1
	$(VENV)/bin/mypy

test: lint
	$(PY) -m pytest

demo: $(STAMP)
	$(PY) -m tickwheel.node.demo

bench: $(STAMP)
	$(PY) -m tickwheel.wheel.bench --json
	$(PY) -m tickwheel.replication.bench --json
	$(PY) -m tickwheel.node.bench --json

bench-quick: $(STAMP)
	$(PY) -m tickwheel.wheel.bench --json --quick
	$(PY) -m tickwheel.replication.bench --json --quick
	$(PY) -m tickwheel.node.bench --json --quick

# The long chaos run: 10 minutes, every fault, then the audit (report in chaos-out/audit/).
CHAOS_OUT ?= chaos-out
chaos: $(STAMP)
	rm -rf $(CHAOS_OUT)
	$(PY) -m tickwheel.chaos run --out $(CHAOS_OUT) --duration 600 --rate 300 --faults all
	$(PY) -m tickwheel.chaos.audit $(CHAOS_OUT)

clean:
	rm -rf $(VENV) build .pytest_cache .ruff_cache .hypothesis *.egg-info chaos-out
