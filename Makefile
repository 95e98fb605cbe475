# `make test` is what CI runs: it builds its own virtualenv, installs the
# project with its dev extras and the system tools the tests need, then runs
# lint, type checks and the whole suite. `make demo` needs only the runtime,
# so a first run on a fresh machine does not wait for the test tooling.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

# The real servers (kube-apiserver, etcd, kubectl, helm, promtool, nats-server from
# the Go module proxy; Apache Kafka from Maven Central), built once into a cache outside the
# repository; see tools/realdeps/build.
REALDEPS ?= $(or $(REALDEPS_CACHE),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/k8s-bridge-realdeps)
export REALDEPS_CACHE := $(REALDEPS)

.PHONY: test test-fast test-real lint types pytest demo bench tools realdeps lock clean

# The locks pin every package with its hashes, for Python 3.11 on linux x86_64
# (what CI and the image run); pyproject.toml keeps the ranges. The project
# itself goes on top, editable and without dependencies, so nothing is taken
# from PyPI that a lock does not name.
RUNTIME_LOCK := requirements/runtime.txt
DEV_LOCK := requirements/dev.txt

# The runtime dependencies and the project: what `k8s-bridge` needs to run.
$(BIN)/.runtime: pyproject.toml $(RUNTIME_LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --require-hashes -r $(RUNTIME_LOCK)
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $@

# On top: the dev extras (pytest, ruff, mypy, hypothesis, ...).
$(BIN)/.installed: $(BIN)/.runtime $(DEV_LOCK)
	$(BIN)/python -m pip install -q --require-hashes -r $(DEV_LOCK)
	touch $@

# Refreshes both locks from pyproject.toml, keeping each pin the ranges still
# allow: `make lock LOCK_ARGS=--upgrade` takes the newest versions they allow,
# `LOCK_ARGS='--upgrade-package aiohttp'` one package. The runtime lock is
# resolved within the dev lock, so both pin the same versions. uv resolves for
# the target platform whatever machine it runs on; it has a virtualenv of its
# own (in $(VENV)/lock-tools), apart from the project's packages.
UV_VERSION := 0.13.8
LOCK_VENV := $(VENV)/lock-tools
UV_COMPILE = $(LOCK_VENV)/bin/uv pip compile --quiet pyproject.toml --generate-hashes \
	--python-version 3.11 --python-platform x86_64-unknown-linux-gnu \
	--custom-compile-command 'make lock'

lock:
	test -x $(LOCK_VENV)/bin/python || $(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install -q uv==$(UV_VERSION)
	$(UV_COMPILE) --extra dev -o $(DEV_LOCK) $(LOCK_ARGS)
	$(UV_COMPILE) -c $(DEV_LOCK) -o $(RUNTIME_LOCK) $(LOCK_ARGS)

# PostgreSQL (for `k8s-bridge mirror`'s tests, which start their own server with
# initdb and pg_ctl in a temporary folder): Debian keeps its binaries out of PATH,
# in /usr/lib/postgresql/<version>/bin, so that is where to look for them.
tools:
	@command -v npm >/dev/null 2>&1 || { \
	  echo "installing Node.js and npm (Debian packages, for the AsyncAPI CLI)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm) >/dev/null </dev/null; }
	@ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || { \
	  echo "installing PostgreSQL (Debian package)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql) >/dev/null </dev/null; }

realdeps:
	bash tools/realdeps/build >/dev/null

lint: $(BIN)/.installed
	$(BIN)/ruff check bridge tests bench
	$(BIN)/ruff format --check bridge tests bench
	$(BIN)/lint-imports --no-cache

types: $(BIN)/.installed
	$(BIN)/mypy

# The built kubectl and helm come first on PATH, so no test uses whatever
# kubectl or helm a machine happens to have.
pytest: $(BIN)/.installed tools realdeps
	PATH="$(REALDEPS)/bin:$$PATH" $(BIN)/pytest -q -p no:cacheprovider --durations=15

test-real: $(BIN)/.installed tools realdeps
	PATH="$(REALDEPS)/bin:$$PATH" $(BIN)/pytest -q -p no:cacheprovider -m real

test: lint types pytest

# The unit and integration tiers only (the emulator, nats-server, one Kafka
# broker; no kube-apiserver, no processes of the bridge): what to run while
# changing code. The slowest tests are printed, so a slow one is seen.
test-fast: $(BIN)/.installed tools realdeps
	PATH="$(REALDEPS)/bin:$$PATH" $(BIN)/pytest -q -p no:cacheprovider --durations=10 tests/unit tests/integration

demo: $(BIN)/.runtime
	$(BIN)/k8s-bridge demo

# Every benchmark, the peer one included: its collector is built first (once,
# cached with the real servers; never by `make test`).
bench: $(BIN)/.installed tools realdeps
	bash tools/peers/build >/dev/null
	PATH="$(REALDEPS)/bin:$$PATH" $(BIN)/python -m bench

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache
