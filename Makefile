# The two commands a newcomer needs: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: run test lint browser bench clean

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

# The operator's page is tested in Debian's headless chromium (tests/operate/test_page_browser.py):
# installed here with apt-get when missing and running as root (CI), saying so first; with
# NO_APT=1, or not root, nothing is installed: the test says how, and skips.
NO_APT ?=
browser:
	@if ! command -v chromedriver >/dev/null || ! command -v chromium >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && [ -z "$(NO_APT)" ] && command -v apt-get >/dev/null; then \
	    echo "make: installing Debian packages chromium and chromium-driver with apt-get (running as root; NO_APT=1 skips): the operator's page test drives a headless browser"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	  else echo "make: no chromium/chromedriver (apt-get install chromium chromium-driver): the browser test will skip"; fi; \
	fi

# pytest exits 5 when it collects nothing; that must fail, and it does because make stops on any non-zero status.
test: lint browser
	$(BIN)/python -m pytest

bench: $(VENV)/.installed-dev
	$(BIN)/python benchmarks/loop_overhead.py
	$(BIN)/python benchmarks/context.py
	$(BIN)/python benchmarks/startup.py
	$(BIN)/python benchmarks/concurrency.py
	$(BIN)/python benchmarks/relay.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
