# `make test` and `make demo` bootstrap .venv themselves on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench replay clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/maitred demo

test: $(STAMP)
	$(BIN)/pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_middleware.py
	$(BIN)/python benchmarks/bench_store.py
	$(BIN)/python benchmarks/bench_scheduler.py

replay: $(STAMP)
	$(BIN)/maitred bench replay --trace synthetic:claude-code --concurrency 20,50,80 --cpu-ratio 1,2 --duration 3600 --seed 0 --out out/synthetic

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis maitred-demo.db*
