# The README's commands. Everything CI needs is installed from here.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
CONFIG ?= config.toml

.PHONY: install dev run test lint bench synapse clean

install: $(VENV)/.installed
dev: $(VENV)/.dev-installed
synapse: .venv-synapse/.installed

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

run: install
	$(BIN)/python app.py --config $(CONFIG)

test: dev synapse
	$(BIN)/python -m pytest

lint: dev
	$(BIN)/python -m compileall -q app.py budget homeserver tests loadtests

bench: dev
	$(BIN)/python -m budget.bench

clean:
	rm -rf $(VENV) .venv-synapse .pytest_cache .hypothesis
