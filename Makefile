# `make test` is what CI runs: it builds its own virtualenv, installs the
# project with its dev extras and the system tools the tests need, then runs
# lint, type checks and the whole suite. `make demo` needs only the runtime,
# so a first run on a fresh machine does not wait for the test tooling.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

# The real servers (kube-apiserver, etcd, kubectl, helm from the Go module
# proxy; Apache Kafka from Maven Central), built once into a cache outside the
# repository; see tools/realdeps/build.
REALDEPS ?= $(or $(REALDEPS_CACHE),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/k8s-bridge-realdeps)
export REALDEPS_CACHE := $(REALDEPS)

.PHONY: test test-real lint types pytest demo bench tools realdeps clean

# The runtime dependencies and the project: what `k8s-bridge` needs to run.
$(BIN)/.runtime: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e .
	touch $@

# On top: the dev extras (pytest, ruff, mypy, hypothesis, ...).
$(BIN)/.installed: $(BIN)/.runtime
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

tools:
	@command -v nats-server >/dev/null 2>&1 || { \
	  echo "installing nats-server (Debian package)"; \
	  (apt-get update -qq && apt-get install -y -qq nats-server) >/dev/null; }

realdeps:
	bash tools/realdeps/build >/dev/null

lint: $(BIN)/.installed
	$(BIN)/ruff check bridge tests bench
	$(BIN)/ruff format --check bridge tests bench

types: $(BIN)/.installed
	$(BIN)/mypy

# The built kubectl and helm come first on PATH, so no test uses whatever
# kubectl or helm a machine happens to have.
pytest: $(BIN)/.installed tools realdeps
	PATH="$(REALDEPS)/bin:$$PATH" $(BIN)/pytest -q -p no:cacheprovider

test-real: $(BIN)/.installed tools realdeps
	PATH="$(REALDEPS)/bin:$$PATH" $(BIN)/pytest -q -p no:cacheprovider -m real

test: lint types pytest

demo: $(BIN)/.runtime
	$(BIN)/k8s-bridge demo

bench: $(BIN)/.installed tools
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache
