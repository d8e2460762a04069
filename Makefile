# The two commands a newcomer needs: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: run test lint bench clean

# Each stamp is rebuilt only when pyproject.toml changes, so both targets are idempotent.
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

run: $(VENV)/.installed
	$(BIN)/parley run

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# pytest exits 5 when it collects nothing; that must fail, and it does because make stops on any non-zero status.
test: lint
	$(BIN)/python -m pytest

bench: $(VENV)/.installed-dev
	$(BIN)/python benchmarks/loop_overhead.py
	$(BIN)/python benchmarks/context.py
	$(BIN)/python benchmarks/startup.py
	$(BIN)/python benchmarks/concurrency.py
	$(BIN)/python benchmarks/relay.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
