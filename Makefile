# The README's commands. Everything CI needs is installed from here.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
CONFIG ?= config.toml

.PHONY: install dev run test lint bench synapse clean

install: $(VENV)/.installed
dev: $(VENV)/.dev-installed

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: requirements.txt pyproject.toml | $(VENV)/bin/python
	$(BIN)/pip install -q -r requirements.txt
	touch $@

$(VENV)/.dev-installed: requirements-dev.txt $(VENV)/.installed
	$(BIN)/pip install -q -r requirements-dev.txt
	touch $@

run: install
	$(BIN)/python app.py --config $(CONFIG)

test: dev
	$(BIN)/python -m pytest

lint: dev
	$(BIN)/python -m compileall -q app.py budget homeserver tests loadtests

bench: dev
	$(BIN)/python -m budget.bench

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
