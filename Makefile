# `make test` and `make demo` bootstrap .venv themselves on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The demo needs only the package itself; the test suite needs the [dev] set (integrations, linters).
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: demo test lint bench replay clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP) $(DEMO_STAMP)

$(DEMO_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/maitred demo

# The gates run first: a lint or type error fails `make test` like a failing test does.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

test: lint
	$(BIN)/pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_middleware.py
	$(BIN)/python benchmarks/bench_store.py
	$(BIN)/python benchmarks/bench_scheduler.py

replay: $(STAMP)
	$(BIN)/maitred bench replay --trace synthetic:claude-code --concurrency 20,50,80 --cpu-ratio 1,2 --duration 3600 --seed 0 --out out/synthetic

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis maitred-demo.db* maitred-demo.png
