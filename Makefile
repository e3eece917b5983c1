# The README's commands. Everything CI needs is installed from here.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
JS_SDK := tests/e2ee/js
CONFIG ?= config.toml

.PHONY: install dev run test lint bench bench-tools wrk synapse haproxy js-sdk image clean

install: $(VENV)/.installed
dev: $(VENV)/.dev-installed
synapse: .venv-synapse/.installed
js-sdk: $(JS_SDK)/node_modules/.installed

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: requirements.txt pyproject.toml | $(VENV)/bin/python
	$(BIN)/pip install -q -r requirements.txt
	touch $@

$(VENV)/.dev-installed: requirements-dev.txt $(VENV)/.installed
	$(BIN)/pip install -q -r requirements-dev.txt
	touch $@

# Synapse for the federation interop tests, in a venv of its own (its dependencies are not ours).
.venv-synapse/.installed: requirements-synapse.txt constraints-synapse.txt
	$(PYTHON) -m venv .venv-synapse
	.venv-synapse/bin/pip install -q -r requirements-synapse.txt -c constraints-synapse.txt
	touch $@

# matrix-js-sdk and its Rust crypto (WASM) for tests/e2ee/test_js_sdk.py, exactly as the lock
# file pins them; no package runs an install script. Without npm, or if npm ci fails, make goes
# on: the test then skips, or fails under CI=true.
$(JS_SDK)/node_modules/.installed: $(JS_SDK)/package.json $(JS_SDK)/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
		(cd $(JS_SDK) && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error \
			&& touch node_modules/.installed) \
			|| echo "npm ci failed: tests/e2ee/test_js_sdk.py will skip (fail under CI=true)"; \
	else \
		echo "npm is missing (install Node.js 20 or later): tests/e2ee/test_js_sdk.py will skip"; \
	fi

run: install
	$(BIN)/python app.py --config $(CONFIG)

test: dev synapse haproxy js-sdk wrk
	$(BIN)/python -m pytest

# A tool from the distribution's packages, installed when missing and we are root, as CI
# is; if it cannot be installed, make goes on and says what that costs.
# $(call apt_tool,command,package,what happens without it)
define apt_tool
	@if ! command -v $(1) >/dev/null 2>&1 && [ ! -x /usr/sbin/$(1) ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing $(2) (apt-get)"; \
			apt-get update -qq >/dev/null 2>&1 || true; \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(2) >/dev/null 2>&1 \
				|| echo "apt-get could not install $(2): $(3)"; \
		else \
			echo "$(1) is missing (install it: apt-get install $(2)): $(3)"; \
		fi; \
	fi
endef

# HAProxy for tests/deploy (a real balancer in front of the server).
haproxy:
	$(call apt_tool,haproxy,haproxy,tests/deploy will skip (fail under CI=true))

# The production image, where a Docker engine answers. The tests do not need it:
# tests/deploy checks the Dockerfile as text, and runs HAProxy and Weir without containers.
image:
	@if docker info >/dev/null 2>&1; then \
		docker build -t weir .; \
	else \
		echo "make image: no Docker engine answers here (docker info failed); nothing built."; \
		echo "The tests do not need the image; build it where Docker runs: docker build -t weir ."; \
	fi

# Lint and types (pyproject.toml holds their settings); .ci/run runs this before the tests.
lint: dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Figures, not tests: the admission micro-benchmark, every loadtests/*_bench.py, then the
# load test with 30 s per phase (it judges itself; its results go to loadtests/results/).
BENCHES := $(basename $(notdir $(sort $(wildcard loadtests/*_bench.py))))

# The throughput and cluster benches drive the server with wrk, and the suite runs the
# cluster bench at a tiny size (tests/loadtests): installed when missing, from the
# distribution's packages (`apt_tool`). `make test` goes on without it (that test then fails,
# saying so); `make bench` stops.
wrk:
	$(call apt_tool,wrk,wrk,the cluster bench's smoke test will fail)

bench-tools: wrk
	@command -v wrk >/dev/null || { echo "wrk is missing: install it (apt-get install wrk)"; exit 1; }

bench: dev bench-tools
	$(BIN)/python -m budget.bench
	@set -e; for bench in $(BENCHES); do \
		echo "== python -m loadtests.$$bench"; $(BIN)/python -m loadtests.$$bench; done
	$(BIN)/python -m loadtests.run --duration 30

clean:
	rm -rf $(VENV) .venv-synapse .pytest_cache .hypothesis $(JS_SDK)/node_modules
