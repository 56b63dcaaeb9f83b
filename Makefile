# A new user needs two commands: `make demo` and `make test`. Each creates .venv and installs
# what it needs on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test test-load soak lint demo bench deps clean

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
	$(BIN)/mypy

test: lint deps
	$(BIN)/pytest

test-load: $(STAMP) deps
	$(BIN)/pytest -m load

soak: $(STAMP)
	$(BIN)/python -m tests.soak

demo: $(STAMP)
	$(BIN)/rillet demo

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
