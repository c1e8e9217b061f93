# The two fresh-machine commands: `make run` starts the gateway, `make test` runs every check.
# Each creates the local virtualenv (.venv) and installs what it needs on first use.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# The admin's file if there is one, else the commented example (a backend on 127.0.0.1:11434).
CONFIG ?= $(if $(wildcard fairgate.yaml),fairgate.yaml,deploy/fairgate.example.yaml)

.PHONY: run test lint demo sim venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	FAIRGATE_CONFIG=$${FAIRGATE_CONFIG:-$(CONFIG)} $(BIN)/fairgate serve

test: lint
	$(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

demo: $(STAMP)
	$(BIN)/fairgate demo

sim: $(STAMP)
	$(BIN)/fairgate sim --port 11435 --parallel 2

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
