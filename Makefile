# A new user needs two commands: `make demo` and `make test`. Each creates .venv and installs
# what it needs on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test test-load soak soak-workers lint demo bench deps clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

# system packages some tests use (a headless browser, a Redis server): installed when root,
# otherwise those tests are skipped with a message saying why
deps:
	bash scripts/test-deps.sh

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python scripts/typecheck.py

test: lint deps
	$(BIN)/pytest

test-load: $(STAMP) deps
	$(BIN)/pytest -m load

soak: $(STAMP)
	$(BIN)/python -m tests.soak

# the same against two worker processes, with worker kills and Redis restarts (redis-server)
soak-workers: $(STAMP)
	$(BIN)/python -m tests.soak --workers 2 --turns 1000 --seconds 1200

# the scripted turns in the terminal, then the live page stays up until Ctrl-C
demo: $(STAMP)
	@echo "rillet is installed in $(VENV): run it as $(BIN)/rillet, or 'source $(BIN)/activate' first"
	$(BIN)/rillet demo --keep-serving

# `make bench` (about 15 minutes; `make bench BENCH_ARGS=--quick` for a short run): the main venv
# gets the `bench` extra (matplotlib, for the charts); the peers (OpenAI and Anthropic SDKs,
# LiteLLM, MMSP) go into bench/.venv-peers only. A peer that cannot be installed is reported as
# not available rather than failing the run.
PEERS := bench/.venv-peers
PEERS_STAMP := $(PEERS)/.installed

$(PEERS_STAMP): bench/peers-requirements.txt bench/litellm-proxy-requirements.txt
	test -x $(PEERS)/bin/python || $(PY) -m venv $(PEERS)
	@if $(PEERS)/bin/python -m pip install -q -r bench/peers-requirements.txt; then \
	  $(PEERS)/bin/python -m pip install -q 'litellm==1.110.2' \
	    || echo "bench: litellm could not be installed; its row will say not available"; \
	  $(PEERS)/bin/python -m pip install -q -r bench/litellm-proxy-requirements.txt \
	    || echo "bench: LiteLLM's proxy could not be installed; its gateway row will say so"; \
	  touch $(PEERS_STAMP); \
	else echo "bench: the peers could not be installed; their rows will say not available"; fi

bench: $(STAMP) $(PEERS_STAMP)
	$(BIN)/python -c 'import matplotlib' 2>/dev/null || $(BIN)/python -m pip install -q -e '.[test,bench]'
	$(BIN)/python -m bench all --fanout --redis --workers $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
